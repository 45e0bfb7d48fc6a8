"""compat_matrix.yaml: the real file validates, and every kind of broken file is a typed error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.shipped import MATRIX_FILE
from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix import MATRIX_ENV_VAR, load_matrix, parse_matrix


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(MATRIX_FILE.read_text())


def broken(doc: dict[str, Any], mutate) -> str:
    d = copy.deepcopy(doc)
    mutate(d)
    return yaml.safe_dump(d, sort_keys=False)


def test_real_matrix_loads_with_every_release_and_environment():
    m = load_matrix(MATRIX_FILE)
    assert [r.name for r in m.maxtext] == ["0.1.0", "0.2.0", "0.2.1", "0.2.2", "0.2.3", "0.2.4", "0.2.5"]
    assert {"maxtext-0.2.5", "maxtext-0.1.0", "maxtext-0.1.0-jax011"} <= set(m.environments)
    # The conventions the issue defines: legacy before #2616, kv_return up to 0.2.1, scan carry from 0.2.2.
    assert {r.name: r.convention for r in m.maxtext} == {
        "0.1.0": "legacy",
        "0.2.0": "kv_return",
        "0.2.1": "kv_return",
        "0.2.2": "kv_scan_carry",
        "0.2.3": "kv_scan_carry",
        "0.2.4": "kv_scan_carry",
        "0.2.5": "kv_scan_carry",
    }


def test_environment_pins_match_the_issue(doc):
    m = load_matrix(MATRIX_FILE)
    e025 = m.environment("maxtext-0.2.5")
    assert {"maxtext==0.2.5", "tpu-inference==0.32.0", "vllm-tpu==0.32.0"} <= set(e025.requirements)
    e010 = m.environment("maxtext-0.1.0")
    assert {"jax==0.7.0", "flax==0.11.2", "tensorflow_cpu==2.19.1", "maxtext==0.1.0"} <= set(e010.no_deps)
    ej = m.environment("maxtext-0.1.0-jax011")
    assert {"jax==0.11.2", "flax==0.12.10", "tpu-inference==0.32.0", "vllm-tpu==0.32.0"} <= set(ej.requirements)
    assert ej.maxtext == e010.maxtext == "0.1.0"


def test_like_copies_the_pins_with_this_release_of_maxtext(doc):
    d = copy.deepcopy(doc)
    d["environments"]["mt-0.2.4"] = {
        "description": "0.2.4 on 0.2.5's stack",
        "maxtext": "0.2.4",
        "like": "maxtext-0.2.5",
    }
    d["environments"]["mt-0.2.3"] = {
        "description": "own overrides win",
        "maxtext": "0.2.3",
        "like": "maxtext-0.2.5",
        "overrides": ["qwix==0.1.9"],
        "serving": False,
    }
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    base, copy24, copy23 = (m.environment(n) for n in ("maxtext-0.2.5", "mt-0.2.4", "mt-0.2.3"))
    assert "maxtext==0.2.4" in copy24.requirements and "maxtext==0.2.5" not in copy24.requirements
    assert [r for r in copy24.requirements if not r.startswith("maxtext==")] == [
        r for r in base.requirements if not r.startswith("maxtext==")
    ]
    assert (copy24.overrides, copy24.env, copy24.serving, copy24.python, copy24.exclude_newer) == (
        base.overrides, base.env, base.serving, base.python, base.exclude_newer
    )  # fmt: skip
    assert copy23.overrides == ("qwix==0.1.9",) and copy23.serving is False
    assert "maxtext==0.2.3" in copy23.requirements


def test_extra_requirements_add_to_own_pins_and_to_copied_ones(doc):
    d = copy.deepcopy(doc)
    d["environments"]["own"] = {"description": "own pins", "python": "3.12", "requirements": ["six==1.17.0"],
                                "extra_requirements": ["idna==3.10"]}  # fmt: skip
    d["environments"]["copied"] = {"description": "copied pins", "maxtext": "0.2.4", "like": "maxtext-0.2.5",
                                   "extra_requirements": ["idna==3.10"]}  # fmt: skip
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    own, copied, base = m.environment("own"), m.environment("copied"), m.environment("maxtext-0.2.5")
    assert own.requirements == ("six==1.17.0", "idna==3.10") and own.like is None
    assert copied.requirements[-1] == "idna==3.10" and len(copied.requirements) == len(base.requirements) + 1
    assert copied.like == "maxtext-0.2.5" and copied.extra_requirements == ("idna==3.10",)
    assert "python" not in d["environments"]["copied"] and copied.python == base.python  # a required key, copied


def test_wheels_for_python_are_read_copied_by_like_and_hashed_only_when_set(doc):
    d = copy.deepcopy(doc)
    d["environments"]["maxtext-0.2.5"]["wheels_for_python"] = {"python": "3.12", "no_deps": ["vllm-tpu==0.32.0"]}
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    base, copied = m.environment("maxtext-0.2.5"), m.environment("maxtext-0.2.4")
    assert base.wheels_for_python is not None
    assert (base.wheels_for_python.python, base.wheels_for_python.no_deps) == ("3.12", ("vllm-tpu==0.32.0",))
    assert copied.wheels_for_python == base.wheels_for_python  # `like:` copies it with the other pins
    assert base.as_dict()["wheels_for_python"] == {"python": "3.12", "no_deps": ["vllm-tpu==0.32.0"]}
    # Left out of the spec hash's input where unset: adding the field rebuilt no other environment.
    assert "wheels_for_python" not in load_matrix(MATRIX_FILE).environment("maxtext-0.2.5").as_dict()


def test_env_var_points_at_a_user_matrix(tmp_path, monkeypatch, doc):
    own = tmp_path / "mine.yaml"
    d = copy.deepcopy(doc)
    d["maxtext"] = d["maxtext"][:1]
    d["environments"] = {}
    own.write_text(yaml.safe_dump(d))
    monkeypatch.setenv(MATRIX_ENV_VAR, str(own))
    m = load_matrix()
    assert m.source == str(own)
    assert [r.name for r in m.maxtext] == ["0.1.0"]


def test_missing_file_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(MatrixError) as e:
        load_matrix(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(e.value)
    assert MATRIX_ENV_VAR in str(e.value)


def _first_row(d):
    return d["maxtext"][0]


CASES = [
    # (id, mutation, key that must be named, words that must appear)
    ("top-level-list", lambda d: d.clear() or (d.update({"x": 1}) and None), "x", "unknown key"),
    ("missing-schema", lambda d: d.pop("schema_version"), "schema_version", "missing"),
    ("schema-too-new", lambda d: d.update(schema_version=2), "schema_version", "unsupported"),
    ("schema-not-int", lambda d: d.update(schema_version="one"), "schema_version", "integer"),
    ("typo-top-level", lambda d: d.update(environmnets={}), "environmnets", "unknown key"),
    ("row-date-not-a-day", lambda d: _first_row(d).update(date="2025-09-31"), "maxtext[0].date", "calendar date"),
    ("row-date-not-iso", lambda d: _first_row(d).update(date="15/09/2025"), "maxtext[0].date", "calendar date"),
    (
        "tpi-release-without-date",
        lambda d: d["tpu_inference"][0]["releases"]["0.11.1"].pop("date"),
        "tpu_inference[0].releases.0.11.1.date",
        "missing",
    ),
    ("dev-builds-bad-relation", lambda d: d["dev_builds"].update(tpu_inference="later"), "dev_builds", "one of"),
    ("dev-builds-unknown-package", lambda d: d["dev_builds"].update(jax="after_release"), "dev_builds", "['jax']"),
    ("row-missing-convention", lambda d: _first_row(d).pop("convention"), "maxtext[0].convention", "missing"),
    (
        "row-bad-convention",
        lambda d: _first_row(d).update(convention="newest"),
        "maxtext[0].convention",
        "one of",
    ),
    (
        "convention-vs-params",
        lambda d: _first_row(d)["params"].update(attention=["kv_cache"]),
        "maxtext[0].convention",
        "disagrees",
    ),
    (
        "bad-class-ref",
        lambda d: _first_row(d)["classes"].update(attention="MaxText.layers.attentions.Attention"),
        "maxtext[0].classes.attention",
        "module:Class",
    ),
    (
        "class-outside-root",
        lambda d: _first_row(d)["classes"].update(attention="maxtext.layers.attentions:Attention"),
        "maxtext[0].classes",
        "outside the import root",
    ),
    (
        "bad-return",
        lambda d: _first_row(d)["returns"].update(attention="(out, kv)"),
        "returns.attention",
        "one of",
    ),
    (
        "bad-bool",
        lambda d: _first_row(d).update(scan_kv_carry="yes"),
        "maxtext[0].scan_kv_carry",
        "true or false",
    ),
    ("bad-release", lambda d: _first_row(d).update(release="zero"), "maxtext[0].release", "PEP 440"),
    ("duplicate-release", lambda d: d["maxtext"].append(copy.deepcopy(d["maxtext"][0])), "maxtext", "twice"),
    (
        "unknown-param",
        lambda d: _first_row(d)["params"].update(attention=["page_stat"]),
        "params.attention",
        "page_stat",
    ),
    (
        "warn-without-deadline",
        lambda d: _first_row(d)["deprecation"].update(policy="warn"),
        "maxtext[0].deprecation",
        "ends_in",
    ),
    (
        "overlapping-ranges",
        lambda d: d["tpu_inference"][1].update(versions=">=0.11.5,<0.18.0"),
        "tpu_inference",
        "overlap",
    ),
    (
        "curried-without-factory",
        lambda d: d["tpu_inference"][0]["rpa"].pop("factory_params"),
        "tpu_inference[0].rpa.call_form",
        "factory_params",
    ),
    (
        "bad-arity",
        lambda d: d["tpu_inference"][0].update(model_return_arity=5),
        "model_return_arity",
        "3 or 4",
    ),
    (
        "bad-specifier",
        lambda d: d["tpu_inference"][0].update(versions="about 0.7"),
        "tpu_inference[0].versions",
        "specifier",
    ),
    (
        "release-outside-range",
        lambda d: d["tpu_inference"][0]["releases"].update({"0.32.0": {"jax": "0.11.2", "date": "2026-11-20"}}),
        "tpu_inference[0].releases.0.32.0",
        "outside",
    ),
    (
        "release-bad-jax",
        lambda d: d["tpu_inference"][0]["releases"]["0.11.1"].update(jax="new"),
        "releases.0.11.1.jax",
        "jax version",
    ),
    (
        "bad-requirement",
        lambda d: d["environments"]["maxtext-0.2.5"]["requirements"].append("jax=="),
        "environments.maxtext-0.2.5.requirements[",  # the element itself
        "PEP 508",
    ),
    (
        "bad-extra-requirement",
        lambda d: d["environments"]["maxtext-0.2.4"].update(extra_requirements=["ok==1", "jax=="]),
        "environments.maxtext-0.2.4.extra_requirements[1]",
        "PEP 508",
    ),
    (
        "environment-typo",
        lambda d: d["environments"]["unit"].update(requirments=["six"]),
        "environments.unit",
        "unknown key(s) ['requirments']",
    ),
    (
        "env-without-row",
        lambda d: d["environments"]["maxtext-0.2.5"].update(maxtext="0.9.9"),
        "environments.maxtext-0.2.5.maxtext",
        "without a row",
    ),
    (
        "env-bad-name",
        lambda d: d["environments"].update({"a b": d["environments"]["unit"]}),
        "a b",
        "not a valid environment name",
    ),
    (
        "requirements-not-list",
        lambda d: d["environments"]["unit"].update(requirements="jax"),
        "environments.unit.requirements",
        "list",
    ),
    (
        "like-unknown-env",
        lambda d: d["environments"].update({"mt-x": {"description": "x", "maxtext": "0.2.4", "like": "nope"}}),
        "environments.mt-x.like",
        "not defined above",
    ),
    (
        "like-without-maxtext",
        lambda d: d["environments"].update({"mt-x": {"description": "x", "like": "maxtext-0.2.5"}}),
        "environments.mt-x.like",
        "both must name one",
    ),
    (
        "like-env-without-maxtext-pin",
        lambda d: d["environments"].update({"mt-x": {"description": "x", "maxtext": "0.2.4", "like": "unit"}}),
        "environments.mt-x.like",
        "both must name one",
    ),
    (
        "wheels-for-python-bad-pin",
        lambda d: d["environments"]["tpu-inference-0.25.0"]["wheels_for_python"].update(no_deps=["vllm-tpu=="]),
        "environments.tpu-inference-0.25.0.wheels_for_python.no_deps[0]",
        "not valid",
    ),
    (
        "wheels-for-python-without-python",
        lambda d: d["environments"]["tpu-inference-0.25.0"]["wheels_for_python"].pop("python"),
        "environments.tpu-inference-0.25.0.wheels_for_python.python",
        "missing",
    ),
    (
        "shim-bad-version",
        lambda d: d["cpu_shim"].update(verified_jax=["latest"]),
        "verified_jax[0]",
        "version",
    ),
]


@pytest.mark.parametrize("case_id,mutate,key,words", CASES, ids=[c[0] for c in CASES])
def test_broken_matrix_is_a_typed_error_naming_path_and_key(doc, case_id, mutate, key, words):
    text = broken(doc, mutate)
    with pytest.raises(MatrixError) as e:
        parse_matrix(text, "user/compat_matrix.yaml")
    msg = str(e.value)
    assert "user/compat_matrix.yaml" in msg
    assert key in msg, msg
    assert words in msg, msg
    assert e.value.path == "user/compat_matrix.yaml"


@pytest.mark.parametrize(
    "text,words",
    [
        ("schema_version: [1\n", "line"),
        ("a: 1\na: 2\n", "duplicate key"),
        ("x: !!python/object/apply:os.system ['echo pwned > /tmp/mc-pwned']\n", "no !!python tags"),
        ("x: !custom 1\n", "custom tags"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("", "must be a mapping"),
    ],
)
def test_unparseable_or_unsafe_yaml_is_a_typed_error(text, words, tmp_path):
    with pytest.raises(MatrixError) as e:
        parse_matrix(text, "m.yaml")
    assert words in str(e.value)
    assert not Path("/tmp/mc-pwned").exists()


def test_merge_keys_may_override_but_explicit_keys_may_not_repeat():
    base = "a: &x {k: 1, j: 2}\nb:\n  <<: *x\n  k: 3\n"
    from maxtext_compat.matrix.yaml_node import safe_load_text

    assert safe_load_text(base, "m.yaml")["b"] == {"k": 3, "j": 2}
    with pytest.raises(MatrixError, match="duplicate key 'k'"):
        safe_load_text("b:\n  k: 1\n  k: 2\n", "m.yaml")
