"""The declared caller convention: values checked at the edge, the order of declarations, who it reaches.

No jax here: the declaration layer (maxtext_compat.convention.callers) and its reporting are plain Python; the
real-model behaviour is in tests/compat/test_declared_convention.py.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from maxtext_compat import doctor
from maxtext_compat.convention import callers
from maxtext_compat.errors import InvalidArgumentError, MatrixError
from maxtext_compat.matrix import load_matrix

pytestmark = pytest.mark.envs("unit")  # plain Python (the declaration layer): once per matrix run is enough


@pytest.fixture
def row():
    return load_matrix().maxtext[0]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(callers.ENV, raising=False)
    previous = callers.set_caller_convention(None)
    yield
    callers.set_caller_convention(previous.value if previous else None)


@pytest.mark.parametrize("bad", ["", "Legacy", " kv_return", "kv_scan_carry", "new", None, 1])
def test_only_the_three_conventions_are_accepted(bad):
    with pytest.raises(InvalidArgumentError) as e:
        callers.check(bad, "convention")
    assert e.value.argument == "convention" and "auto, legacy, kv_return" in str(e.value)


def test_order_wrap_then_block_then_process_then_environment_then_row(row, monkeypatch):
    assert callers.declared(row) == callers.Declared("auto", "compat_matrix.yaml row 0.1.0 (callers:)")
    assert callers.declared(dataclasses.replace(row, callers="kv_return")).value == "kv_return"
    monkeypatch.setenv(callers.ENV, "legacy")
    assert callers.declared(row) == callers.Declared("legacy", "$MAXTEXT_COMPAT_CONVENTION")
    callers.set_caller_convention("kv_return", source="test")
    assert callers.declared(row) == callers.Declared("kv_return", "test")
    with callers.caller_convention("legacy"):
        assert callers.declared(row).source == "caller_convention() block"
        assert callers.declared(row, "auto") == callers.Declared("auto", "wrap(convention=)")
    assert callers.declared(row).value == "kv_return"
    assert [d.value for d in callers.layers(row)] == ["kv_return", "legacy", "auto"]


def test_a_bad_environment_value_is_refused_when_read(row, monkeypatch):
    monkeypatch.setenv(callers.ENV, "tuple")
    with pytest.raises(InvalidArgumentError) as e:
        callers.declared(row)
    assert e.value.argument == callers.ENV and "'tuple'" in str(e.value)


def test_a_block_declares_for_its_own_thread_only(row):
    seen = []
    with callers.caller_convention("kv_return"):
        t = threading.Thread(target=lambda: seen.append(callers.declared(row).value))
        t.start()
        t.join()
        assert callers.declared(row).value == "kv_return"
    assert seen == ["auto"]


def _call_from(module_name: str, row) -> callers.Declared:
    """for_call() as seen from code whose module is `module_name` (its frame's __name__)."""
    namespace = {"__name__": module_name, "callers": callers, "row": row}
    exec(compile("result = callers.for_call(row)", f"<{module_name}>", "exec"), namespace)
    return namespace["result"]


@pytest.mark.parametrize(
    ("module", "declared"),
    [
        ("my_training_loop", "kv_return"),
        ("tpu_inference.models.jax.maxtext", "kv_return"),
        ("MaxText.layers.decoders", "native"),
        ("maxtext.layers.attentions", "native"),
        ("maxtext_compat.serving.backend", "auto"),
    ],
)
def test_maxtexts_and_our_own_calls_keep_the_releases_convention(row, module, declared):
    with callers.caller_convention("kv_return"):
        assert _call_from(module, row).value == declared


def test_the_matrix_row_callers_key_is_checked(tmp_path):
    source = Path(load_matrix().source).read_text()
    source = source.replace("    convention: legacy\n", "    convention: legacy\n    callers: kv_return\n", 1)
    good = tmp_path / "m.yaml"
    good.write_text(source)
    assert load_matrix(str(good)).maxtext[0].callers == "kv_return"
    bad = tmp_path / "bad.yaml"
    bad.write_text(source.replace("callers: kv_return", "callers: tuple", 1))
    with pytest.raises(MatrixError, match="callers"):
        load_matrix(str(bad))


def test_doctor_shows_what_is_declared_and_where(monkeypatch):
    monkeypatch.setenv(callers.ENV, "legacy")
    callers.set_caller_convention("kv_return", source="shims.install('vllm-backport', convention=)")
    report = doctor.collect()
    assert report["callers"]["value"] == "kv_return"
    text = doctor.render(report)
    assert "caller convention: kv_return (from shims.install('vllm-backport', convention=))" in text
    assert "legacy ($MAXTEXT_COMPAT_CONVENTION)" in text
    monkeypatch.setenv(callers.ENV, "2")
    callers.set_caller_convention(None)
    assert "caller convention: ERROR InvalidArgumentError" in doctor.render(doctor.collect())


def test_shims_install_checks_the_convention_before_patching(monkeypatch):
    from maxtext_compat import shims

    built = []
    shims.register_profile("convention-probe", lambda: built.append(1) or [], replace=True)
    try:
        with pytest.raises(InvalidArgumentError):
            shims.install("convention-probe", convention="tuple")
        assert built == [] and not shims.installed("convention-probe")
        shims.install("convention-probe", convention="legacy")
        assert callers.process_convention().value == "legacy"
        shims.uninstall("convention-probe")
        assert callers.process_convention() is None
    finally:
        shims.uninstall("convention-probe")
        shims.unregister_profile("convention-probe")
