"""Fuzzing the matrix loader: 10,000 generated documents end in a typed MatrixError or in facts that match them.

compat_matrix.yaml is user-editable (MAXTEXT_COMPAT_MATRIX), so `parse_matrix` must turn any
text into either a `MatrixError` naming the file, or a matrix whose facts are exactly what the
document says: never another exception, never a silent default. Documents come from three
generators: YAML-ish token soup (tags, anchors, flow/block syntax, odd scalars), structural
mutations of the real matrix (keys dropped, types changed, unknown keys, junk values, valid
alternatives), dumped as block YAML or JSON, and line edits of the real matrix's text (unsafe
and custom tags, deleted/duplicated/re-indented lines). The real matrix is cut to one row of
each kind to keep a parse near 3 ms; the run is derandomized (reproducible in CI) and takes
~45 s in the unit environment (2 shared cores). MAXTEXT_COMPAT_FUZZ_EXAMPLES overrides the example count.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix import (
    CONVENTIONS,
    OPTIONAL_CLASS_KEYS,
    POLICIES,
    RETURN_SHAPES,
    CompatMatrix,
    parse_matrix,
)
from maxtext_compat.matrix.returns import convention_problem, spelling_problem
from maxtext_compat.switches import env_count

# Pure-Python logic, independent of the environment: run once per matrix run (the unit env).
pytestmark = pytest.mark.envs("unit")

EXAMPLES = env_count("MAXTEXT_COMPAT_FUZZ_EXAMPLES", default=1_000, maximum=1_000_000)  # make test-extended: 10,000
PATH = "fuzz/compat_matrix.yaml"
PWNED = Path("/tmp/maxtext-compat-fuzz-pwned")
REAL = yaml.safe_load((Path(__file__).resolve().parents[2] / "compat_matrix.yaml").read_text())


def _small(row: int, tpi: int) -> dict[str, Any]:
    """A valid matrix with one MaxText row and one tpu-inference row of the real file, long texts cut
    (a parse of the whole file takes ~40 ms; this one ~3 ms, so 10,000 documents fit in the unit budget)."""
    doc = copy.deepcopy(REAL)
    mt = doc["maxtext"][row]
    mt.update(notes="n", jax_verified=mt["jax_verified"][:1])
    mt["deprecation"]["migration"] = "m"
    for defect in mt.get("known_defects", []):
        defect.update(summary="s", why="w", how="h")
        if defect.get("remedy", "fix") == "fix":
            defect["undo"] = "u"
    mt["decoder_layers"] = {k: v for k, v in mt["decoder_layers"].items() if k in ("default", "llama2")}
    t = doc["tpu_inference"][tpi]
    t["releases"] = dict(list(t["releases"].items())[:1])
    t["rpa"]["params"] = t["rpa"]["params"][:4]
    t["rpa"]["optional_kwargs"] = t["rpa"].get("optional_kwargs", [])[:2]
    t["metadata"].update(fields=t["metadata"]["fields"][:2], meta_fields=t["metadata"].get("meta_fields", [])[:1])
    t.pop("notes", None)
    doc["cpu_shim"] = {k: v[:1] for k, v in doc["cpu_shim"].items()}
    release = mt["release"]
    pin_set = {"description": "d", "python": "3.12", "maxtext": release, "requirements": [f"maxtext=={release}"]}
    # Both kinds of environment of tests/environments.yaml: one starting from the pin set, one with its own pins.
    from_set = {"pins": f"maxtext-{release}", "serving": True, "extra_requirements": ["six==1.17.0"]}
    own = {"description": "k", "python": "3.12", "maxtext": None, "requirements": ["idna==3.10"]}
    return {
        "schema_version": 1,
        "maxtext": [mt],
        "tpu_inference": [t],
        "cpu_shim": doc["cpu_shim"],
        "pin_sets": {f"maxtext-{release}": pin_set},
        "environments": {f"maxtext-{release}": from_set, "kernel-only": own},
    }


def dump(doc: Any) -> str:
    """Block YAML (libyaml's emitter when present: the loader under test is PyYAML's pure-Python one)."""
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=True)


BASES = [_small(0, 0), _small(-1, -1)]  # legacy + curried RPA; kv_scan_carry with a known defect + flat RPA
BASE, BASE_TEXT = BASES[-1], dump(BASES[-1])
BASE_LINES = [dump(b).splitlines() for b in BASES]
UNSAFE = f"!!python/object/apply:os.system ['touch {PWNED}']"
TAGS = [
    UNSAFE, "!!python/name:os.system", "!!python/module:os", "!custom", "!<tag:example.com,2024:x>", "!!binary",
    "!!set", "!!omap", "!!pairs", "!!timestamp", "!!float", "!!int", "!!str", "!!null", "!!bool", "!!map", "!!seq",
]  # fmt: skip
SCALARS = [
    "", "~", "null", "true", "yes", "No", "on", "0", "-1", "3.10", "0.20", "1e999", ".nan", "-.inf", "0x1F", "0o17",
    "010", "1_000", "12:30:00", "2025-02-30", "2025-09-15", "2026-12-01T00:00:00Z", "'0.2.5'", '"0.2.5"', "0.2.5",
    "legacy", "kv_return", "kv_scan_carry", "ignore", "warn", "error", "curried", "flat", "MaxText", "maxtext",
    "maxtext.layers.attentions:Attention", "a b:c", ">=0.11.1,<0.12.0", "===foo", "jax==", '"\\x00"', "'\\u2028'",
    "[]", "{}", "[1, [2, [3]]]", "{a: {b: {c: 1}}}", "&x [*x]", "*undefined", "|\n  text", ">-\n  folded",
]  # fmt: skip
TOKENS = [
    "\n", "\n  ", "\n    ", "  ", "- ", ": ", ":", "? ", "<<: ", ", ", "[", "]", "{", "}", "'", '"', "#", "&a ", "*a",
    "---\n", "...\n", "%YAML 1.1\n", "%TAG ! tag:example.com,2024:\n", "\t", "schema_version", "maxtext",
    "tpu_inference", "cpu_shim", "environments", "pin_sets", "pins", "release", "convention", "params", "attention",
    "kv_cache", "classes", "versions", "rpa", *TAGS, *SCALARS,
]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Generators
# ----------------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(SCALARS), st.dates(),
)  # fmt: skip
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in the document (mapping keys and list indices)."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = [_paths(b)[1:] for b in BASES]


def _parent(doc: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    node = doc
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


VALID = {  # valid alternatives for some leaves: mutations that should still parse
    "release": ["0.2.6", "1!2.0", "0.3.0rc1", "7"],
    "date": ["2025-01-01", "yesterday"],
    "source_commit": [None, "abc123"],
    "notes": [None, "", "x"],
    "scan_kv_carry": [True, False],
    "policy": ["ignore"],
    "jax_verified": [[], ["0.7.0"], ["1.0", "2.0"]],
    "serving": [True, False],
    "default_decoder": ["linen", "nnx"],
    "python": ["3.12", "3.13"],
    "known_defects": [None, []],
    "scan_kv_carry_layers": [None, [], ["llama2"]],
}


@st.composite
def structural(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A base document with 0-4 mutations, dumped as block YAML or as JSON (flow YAML)."""
    which = draw(st.integers(0, len(BASES) - 1))
    doc = copy.deepcopy(BASES[which])
    for _ in range(draw(st.integers(0, 4))):
        path = draw(st.sampled_from(PATHS[which]))
        try:
            parent, key = _parent(doc, path)
            parent[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced it
        op = draw(st.sampled_from(["drop", "junk", "retype", "unknown", "valid", "valid", "duplicate"]))
        if op == "drop":
            del parent[key]
        elif op == "junk":
            parent[key] = draw(junk)
        elif op == "retype":
            value = parent[key]
            parent[key] = draw(st.sampled_from([[value], {"v": value}, str(value), None, 1, True]))
        elif op == "unknown" and isinstance(parent[key], dict):
            parent[key][draw(st.sampled_from(["extra", "Release", "notes ", "x"]))] = draw(junk)
        elif op == "valid" and key in VALID:
            parent[key] = draw(st.sampled_from(VALID[key]))
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
    if draw(st.booleans()):
        try:  # JSON is flow-style YAML; NaN/Infinity have no JSON spelling that YAML reads back as floats
            return json.dumps(doc, default=str, allow_nan=False), doc
        except ValueError:
            pass
    return dump(doc), doc


@st.composite
def line_edits(draw: st.DrawFn) -> str:
    """A base text with 1-3 line edits: a tag or odd scalar inserted, a line dropped, doubled or re-indented."""
    lines = list(draw(st.sampled_from(BASE_LINES)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["value", "tag", "drop", "double", "indent"]))
        line = lines[i]
        if op in ("value", "tag") and ": " in line:
            head, _, value = line.partition(": ")
            new = draw(st.sampled_from(SCALARS)) if op == "value" else f"{draw(st.sampled_from(TAGS))} {value}"
            lines[i] = f"{head}: {new}"
        elif op == "drop":
            del lines[i]
        elif op == "double":
            lines.insert(i, line)
        else:
            lines[i] = " " * draw(st.integers(0, 6)) + line.lstrip()
    return "\n".join(lines) + "\n"


token_soup = st.lists(st.sampled_from(TOKENS) | st.text(max_size=4), max_size=40).map("".join)
documents = st.one_of(
    token_soup.map(lambda t: (t, None)),
    line_edits().map(lambda t: (t, None)),
    structural(),
)


# ----------------------------------------------------------------------------------------------
# What a parsed document must satisfy
# ----------------------------------------------------------------------------------------------


def check_invariants(m: CompatMatrix) -> None:
    """Facts every successfully parsed matrix has, whatever the document."""
    assert m.schema_version == 1 and m.source == PATH and m.maxtext
    for row in m.maxtext:
        assert isinstance(row.release, Version)
        assert row.convention in CONVENTIONS
        assert (row.convention == "legacy") == ("kv_cache" not in row.params.attention)
        assert row.deprecation.policy in POLICIES and (row.deprecation.policy == "ignore" or row.deprecation.ends_in)
        assert row.classes["attention"] is not None and row.classes["transformer"] is not None
        kv = row.has_kv_params
        for kind, shape in row.returns.items():  # spelled by names that hold to the row's convention
            assert kind in RETURN_SHAPES
            assert shape is None or spelling_problem(shape) is convention_problem(kind, shape, takes_kv=kv) is None
        for ref in [*row.classes.values(), *row.decoder_layers.values()]:
            assert ref is None or ref.module.split(".")[0] == row.import_root
    names = [r.name for r in m.maxtext]
    assert len(names) == len(set(names))
    for env in (*m.pin_sets.values(), *m.environments.values()):
        assert env.maxtext is None or env.maxtext in names
    for pin_set in m.pin_sets.values():  # an install, never a test plan
        assert not pin_set.serving and not pin_set.tests and pin_set.pins is None and not pin_set.extra_no_deps
    for env in m.environments.values():
        if env.pins is not None:  # starts from exactly that set
            base = m.pin_sets[env.pins]
            assert env.requirements == base.requirements + env.extra_requirements
            assert env.no_deps == base.no_deps + env.extra_no_deps
            assert (env.python, env.maxtext, env.overrides) == (base.python, base.maxtext, base.overrides)


def _text(value: Any) -> str:
    """How the loader reads a scalar the document holds as a string."""
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def check_round_trip(m: CompatMatrix, doc: dict[str, Any]) -> None:
    """The parsed facts are the document's own values: nothing defaulted or dropped silently."""
    assert len(m.maxtext) == len(doc["maxtext"]) and len(m.tpu_inference) == len(doc["tpu_inference"])
    for row, d in zip(m.maxtext, doc["maxtext"], strict=True):
        assert row.release == Version(_text(d["release"]))
        assert row.convention == d["convention"] and row.import_root == d["import_root"]
        assert row.params.attention == frozenset(d["params"]["attention"])
        assert row.params.decoder_layer == frozenset(d["params"]["decoder_layer"])
        given = {**dict.fromkeys(OPTIONAL_CLASS_KEYS), **d["classes"]}  # an optional class left out is None
        assert {k: None if v is None else str(v) for k, v in row.classes.items()} == given
        assert {k: str(v) for k, v in row.decoder_layers.items()} == d["decoder_layers"]
        assert dict(row.returns) == d["returns"]
        assert row.scan_kv_carry is d["scan_kv_carry"] and row.default_decoder == d["default_decoder"]
        assert row.jax_verified == tuple(_text(v).strip() for v in d["jax_verified"])
        assert row.deprecation.policy == d["deprecation"]["policy"]
        assert (row.vllm is None) == (d.get("vllm") is None)
        assert [k.id for k in row.known_defects] == [_text(k["id"]).strip() for k in d.get("known_defects") or []]
        assert row.scan_kv_carry_layers == tuple(_text(v).strip() for v in d.get("scan_kv_carry_layers") or ())
        assert row.notes == ("" if d.get("notes") is None else _text(d["notes"]))
    for tpi, d in zip(m.tpu_inference, doc["tpu_inference"], strict=True):
        assert tpi.rpa.call_form == d["rpa"]["call_form"] and tpi.model_return_arity == d["model_return_arity"]
        assert set(tpi.releases) == set(d["releases"]) and tpi.block_sizes == tuple(d["block_sizes"])
    # `environments:` may be left out (the shipped file has none); `pin_sets:` may not
    assert set(m.pin_sets) == set(doc["pin_sets"]) and set(m.environments) == set(doc.get("environments") or {})
    for name, pin_set in m.pin_sets.items():
        d = doc["pin_sets"][name]
        assert pin_set.requirements == tuple(_text(r).strip() for r in d.get("requirements") or ())
        assert pin_set.python == _text(d["python"])
    for name, env in m.environments.items():
        d = doc["environments"][name]
        assert env.serving is (d.get("serving") or False)  # null is "unset": the documented default
        extra = tuple(_text(r).strip() for r in d.get("extra_requirements") or ())
        if d.get("pins") is None:
            assert env.pins is None
            assert env.requirements == tuple(_text(r).strip() for r in d.get("requirements") or ()) + extra
        else:
            assert env.pins == _text(d["pins"])
            assert env.requirements == m.pin_sets[env.pins].requirements + extra


# ----------------------------------------------------------------------------------------------
# The fuzz run
# ----------------------------------------------------------------------------------------------


# The crash the fuzzer found first (shrunk: `schema_version: !!bool 1`): PyYAML's safe constructors raise
# KeyError / IndexError / AttributeError on explicitly tagged odd scalars; matrix.yaml_node.safe_load_text now
# turns every exception of the loader into a MatrixError ("a value could not be read").
CRASHERS = ["schema_version: !!bool 1\n", "x: !!int ''\n", "x: !!float ''\n", "t: !!timestamp x\n"]  # minimal


def test_fuzzed_documents_give_a_matrix_error_or_their_own_facts(record_property):
    counts = {"documents": 0, "parsed": 0, "round_trips": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # the same documents on every run and machine (reproducible CI)
        database=None,
        report_multiple_bugs=False,  # the first failing document, shrunk, not a group
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(documents)
    def run(case: tuple[str, dict[str, Any] | None]) -> None:
        text, doc = case
        counts["documents"] += 1
        try:
            m = parse_matrix(text, PATH)
        except MatrixError as exc:  # the only exception allowed; it names the file
            assert exc.path == PATH and PATH in str(exc)
            return
        counts["parsed"] += 1
        check_invariants(m)
        if doc is not None:
            counts["round_trips"] += 1
            check_round_trip(m, doc)

    t0 = time.perf_counter()
    run()
    elapsed = time.perf_counter() - t0
    record_property("documents", counts["documents"])
    record_property("seconds", round(elapsed, 1))
    print(f"\n{counts['documents']} documents in {elapsed:.1f} s: {counts['parsed']} parsed "
          f"({counts['round_trips']} round-trip checked), the rest MatrixError")  # fmt: skip
    assert counts["documents"] >= EXAMPLES
    assert counts["round_trips"] > 0 and counts["parsed"] < counts["documents"]  # both outcomes exercised
    assert not PWNED.exists(), "an unsafe tag ran code"


@pytest.mark.parametrize("text", CRASHERS)
def test_explicitly_tagged_odd_scalars_are_matrix_errors(text):
    """The fuzzer's findings, minimal: each must be a MatrixError naming the file."""
    with pytest.raises(MatrixError) as err:
        parse_matrix(text, PATH)
    assert PATH in str(err.value) and "Fix:" in str(err.value)


def test_the_base_documents_are_valid_and_round_trip():
    for base in BASES:
        check_round_trip(parse_matrix(dump(base), PATH), base)
        check_round_trip(parse_matrix(json.dumps(base), PATH), base)
        check_round_trip(parse_matrix(yaml.safe_dump(base), PATH), base)


FLOAT_VERSIONS = {
    # id: (edits to the base text, where the parsed value is, the version the text says)
    "python-3.10": ([("python: '3.12'", "python: 3.10")], lambda m: next(iter(m.pin_sets.values())).python, "3.10"),
    "release-0.20": ([("release: 0.2.5", "release: 0.20"), ("maxtext: 0.2.5", "maxtext: 0.20")],
                     lambda m: m.maxtext[-1].name, "0.20"),
}  # fmt: skip


@pytest.mark.parametrize("edits,read,says", FLOAT_VERSIONS.values(), ids=list(FLOAT_VERSIONS))
def test_unquoted_versions_are_not_silently_truncated(edits, read, says):
    source = BASE_TEXT
    for old, new in edits:
        assert old in source
        source = source.replace(old, new)
    try:
        m = parse_matrix(source, PATH)
    except MatrixError as exc:  # refusing it, with a fix that says to quote it, is the right answer
        if "quote" not in str(exc).lower():
            raise
        return
    got = read(m)
    assert Version(got) == Version(says), f"the document says {says}, the loader read {got}"
