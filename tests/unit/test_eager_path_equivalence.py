"""The eager path's shortcuts answer exactly what the slow ways answered (issue 35: ~25 µs -> a few µs per call).

- the generated binder (convention.binding) against `inspect.Signature.bind`, on every release's advertised
  Attention and decoder-layer signature, for calls hypothesis draws (positional, keyword, unknown, missing);
- the environment read (switches.env) against `os.environ.get`, set, unset, empty, changed between reads;
- the declared convention (declared.declared) against the first of `declared.layers`, the slow definition.
The adapters' and shims' own tests (test_adapters_mocked_rows, test_caller_convention, ...) run unchanged.
"""

from __future__ import annotations

import inspect
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.shipped import shipped_matrix
from maxtext_compat import switches
from maxtext_compat.convention import callers
from maxtext_compat.convention.binding import make_binder
from maxtext_compat.convention.signature import advertised_signature

pytestmark = pytest.mark.envs("unit")

SIGS = {  # the releases' own __call__ parameter lists (as in test_adapters_mocked_rows.py)
    "attention 0.1.0": ("attention", "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, "
                        "model_mode='train', deterministic=False, previous_chunk=None, slot=None, page_state=None, "
                        "bidirectional_mask=None"),
    "attention 0.2.5": ("attention", "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, "
                        "out_sharding=None, *, model_mode='train', deterministic=False, previous_chunk=None, "
                        "slot=None, bidirectional_mask=None, rope_kwargs=None, kv_cache=None, "
                        "attention_metadata=None, shared_key=None, shared_value=None"),
    "llama 0.2.5": ("decoder_layer", "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, "
                    "previous_chunk=None, slot=None, kv_cache=None, attention_metadata=None"),
    "with **kwargs": ("decoder_layer", "inputs, decoder_segment_ids, decoder_positions, deterministic=True, "
                      "model_mode='train', **kwargs"),
}  # fmt: skip


def _advertised(kind: str, params: str) -> inspect.Signature:
    ns: dict[str, object] = {}
    exec(f"def f({params}): pass", ns)
    return advertised_signature(inspect.signature(ns["f"]), kind)  # type: ignore[arg-type]


NAMES = sorted({n for kind, p in SIGS.values() for n in _advertised(kind, p).parameters} | {"nope", "kv_caches"})
CALLS = st.tuples(
    st.lists(st.integers(0, 9), max_size=7),  # positional arguments
    st.dictionaries(st.sampled_from(NAMES), st.one_of(st.none(), st.integers(0, 9)), max_size=6),
)


def _inspect(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict | None:
    try:
        bound = dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        return None
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            bound.update(bound.pop(p.name, {}))
    return bound


@pytest.mark.parametrize("name", list(SIGS))
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(call=CALLS)
def test_the_generated_binder_binds_as_inspect_does(name, call):
    sig = _advertised(*SIGS[name])
    binder = make_binder(sig)
    assert binder is not None
    args, kwargs = tuple(call[0]), dict(call[1])
    want = _inspect(sig, args, kwargs)
    try:
        got = binder(*args, **kwargs)
    except TypeError:
        got = None
    assert got == want
    if got is not None:
        assert list(got) == list(want)  # the same order: signature order, as bound.arguments


def test_a_signature_the_binder_does_not_handle_is_left_to_inspect():
    ns: dict[str, object] = {}
    exec("def f(a, /, b, *args, c=1): pass", ns)
    assert make_binder(inspect.signature(ns["f"])) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [None, "", "legacy", "kv_return", "new", " 1"])
def test_the_environment_read_answers_as_os_environ_get(monkeypatch, value):
    name = "MAXTEXT_COMPAT_TEST_SWITCH_35"
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert switches.env(name) == os.environ.get(name)
    monkeypatch.setenv(name, "changed")
    assert switches.env(name) == "changed"
    monkeypatch.delenv(name)
    assert switches.env(name) is None


@pytest.mark.parametrize("scope", [None, "legacy"])
@pytest.mark.parametrize("process", [None, "kv_return"])
@pytest.mark.parametrize("environ", [None, "auto", "legacy"])
@pytest.mark.parametrize("release", ["0.1.0", "0.2.5"])
def test_the_declared_convention_is_the_most_specific_layer(monkeypatch, scope, process, environ, release):
    row = shipped_matrix().row(release)
    if environ is None:
        monkeypatch.delenv(callers.ENV, raising=False)
    else:
        monkeypatch.setenv(callers.ENV, environ)
    previous = callers.set_caller_convention(process)
    try:
        if scope is None:
            got = callers.declared(row)
        else:
            with callers.caller_convention(scope):
                got, slow = callers.declared(row), callers.layers(row)[0]
                assert got == slow
                return
        assert got == callers.layers(row)[0]
        assert callers.declared(row, row_default=callers.row_declaration(row)) == got
    finally:
        callers.set_caller_convention(previous.value if previous else None)
