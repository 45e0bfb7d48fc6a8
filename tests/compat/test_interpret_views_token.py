"""The view patch serves both shapes of JAX's Pallas TPU interpreter callbacks.

jax 0.11/0.12 thread a token (`get(token, ...) -> (token, value)`, `store(...) -> token`, `swap -> (token, old)`);
jax 0.9 does not (`get(...) -> value`, `store(...) -> None`, `swap(...) -> old`). One set of wrappers is written
for the token form; `_add_token` / `_drop_token` adapt the tokenless one. Checked here on fake callbacks that
record what they were given (the real interpreter runs in tests/compat/test_cpu_rpa_shim.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from maxtext_compat.cpu import pallas_views as views

pytestmark = pytest.mark.envs("maxtext-0.2.3")  # numpy only; once is enough


def _tokenless():
    buffers = {7: np.arange(12.0).reshape(3, 4)}
    calls = []

    def get(device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        calls.append(("get", transforms))
        return buffers[buffer_id].copy()

    def store(device_id, local_core_id, memory_space, buffer_id, transforms, val, *args, **kwargs):
        calls.append(("store", transforms))
        buffers[buffer_id] = np.asarray(val).copy()

    def swap(device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, *, source_info=None):
        calls.append(("swap", transforms))
        old = buffers[buffer_id].copy()
        buffers[buffer_id] = np.asarray(val).copy()
        return old

    return {"get": get, "store": store, "swap": swap}, buffers, calls


def test_tokenless_callbacks_are_detected_and_round_trip_through_the_token_form():
    raw, buffers, _ = _tokenless()
    assert not views._takes_token(raw["get"])
    assert views._takes_token(lambda token, device_id: None)
    tokened = views._add_token(raw)
    token, value = tokened["get"]("T", 0, 0, 0, 7, ())
    assert token == "T"
    np.testing.assert_array_equal(value, np.arange(12.0).reshape(3, 4))
    assert tokened["store"]("T", 0, 0, 0, 7, (), np.zeros((3, 4))) == "T"
    token, old = tokened["swap"]("T", 0, 0, 0, 7, (), np.ones((3, 4)), None)
    assert token == "T"
    np.testing.assert_array_equal(old, np.zeros((3, 4)))
    np.testing.assert_array_equal(buffers[7], np.ones((3, 4)))


def test_the_wrappers_keep_the_tokenless_signatures_and_returns():
    raw, buffers, calls = _tokenless()
    tokened = views._add_token(raw)
    wrapped = views._drop_token(
        {
            "get": views._make_get(tokened["get"]),
            "store": views._make_store(tokened["get"], tokened["store"]),
            "swap": views._make_swap(tokened["get"], tokened["store"], tokened["swap"]),
        }
    )
    np.testing.assert_array_equal(wrapped["get"](0, 0, 0, 7, ()), np.arange(12.0).reshape(3, 4))
    assert wrapped["store"](0, 0, 0, 7, (), np.full((3, 4), 2.0)) is None
    old = wrapped["swap"](0, 0, 0, 7, (), np.full((3, 4), 3.0), None)
    np.testing.assert_array_equal(old, np.full((3, 4), 2.0))
    np.testing.assert_array_equal(buffers[7], np.full((3, 4), 3.0))
    assert [c[0] for c in calls] == ["get", "store", "swap"]  # no view in the chain: the stock path, once each
