"""The traced KV-write check's default follows the platform (paged/guard.py): on where JAX's default backend is the
CPU, off on an accelerator, where its host round trip is paid by every step whose outputs are waited for (measured
on a TPU v5e: SmolLM2's decode step 3.5 -> 12.5 ms, docs/accelerators.md). The setting wins either way, and the
accelerator's default is said in the log. The accelerator is injected (jax.default_backend answering "tpu"); the
TPU tier checks the same default on the chip (tests/tpu/test_tier_layers.py)."""

from __future__ import annotations

import logging
import os
from unittest import mock

import pytest

pytestmark = pytest.mark.needs_tpu_inference  # maxtext_compat.paged's metadata form


def _callbacks_traced(backend: str, setting: str | None) -> int:
    """How many host callbacks check_writes_described puts into a jitted step on `backend` with the setting."""
    import jax
    import jax.numpy as jnp

    from maxtext_compat import paged
    from maxtext_compat.paged import guard

    layout = paged.KVCacheLayout(4, 16, 2, 128, "float32")
    alloc = paged.PageAllocator(4, 16)
    md = paged.build_metadata([alloc.append("a", 5)], layout, max_num_tokens=8, max_num_seqs=2, pages_per_seq=2)
    arrays = paged.metadata.metadata_arrays(md)
    names = ("seq_lens", "block_tables", "query_start_loc", "request_distribution")

    def step(cache, positions, *metadata_values):
        metadata = type("TracedMetadata", (), dict(zip(names, metadata_values, strict=True)))()
        guard.check_writes_described([cache], metadata, positions, "test")
        return cache

    env = {k: v for k, v in os.environ.items() if k != guard.TRACED_CHECKS_ENV}
    if setting is not None:
        env[guard.TRACED_CHECKS_ENV] = setting
    with mock.patch.dict(os.environ, env, clear=True), mock.patch.object(jax, "default_backend", return_value=backend):
        jaxpr = jax.make_jaxpr(step)(layout.allocate(1)[0], jnp.zeros((8,), jnp.int32), *arrays)
    return sum(eqn.primitive.name == "debug_callback" for eqn in jaxpr.jaxpr.eqns)


@pytest.mark.parametrize(
    ("backend", "setting", "callbacks"),
    [("cpu", None, 1), ("tpu", None, 0), ("gpu", None, 0), ("tpu", "1", 1), ("cpu", "0", 0)],
)
def test_the_default_follows_the_platform_and_the_setting_wins(backend, setting, callbacks):
    assert _callbacks_traced(backend, setting) == callbacks


def test_an_accelerators_default_is_said_in_the_log(caplog):
    from maxtext_compat.paged import guard

    guard._say_off_by_default.cache_clear()
    with caplog.at_level(logging.INFO, logger=guard.__name__):
        _callbacks_traced("tpu", None)
    said = [r.getMessage() for r in caplog.records if r.name == guard.__name__]
    assert len(said) == 1 and "off on tpu by default" in said[0] and f"{guard.TRACED_CHECKS_ENV}=1" in said[0], said
