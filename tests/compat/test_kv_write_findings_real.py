"""Issue-11 §2 findings through the adapters of the real releases: bad KV metadata is refused, eager and jitted.

Found: on MaxText 0.2.5 none of the metadata checks ran (the adapter handed kv_cache / attention_metadata
straight to MaxText), and under `jit` none ran on any path (traced values). Now an eager call raises the
typed error before anything runs; a jitted step fails when it executes, with the typed error's message,
and returns no cache. Runs with the real tpu-inference kernel: MaxText 0.2.5 natively, 0.1.0 backported.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.1", "maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from maxtext_compat import paged  # noqa: E402
from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError, StaleSliceError  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
NATIVE = ROW.has_kv_params
PAGES, PAGE, TOKENS = 8, 16, 40


@pytest.fixture(scope="module")
def model():
    from jax.sharding import Mesh

    from maxtext_compat.cpu import rpa as cpu_rpa

    assert cpu_rpa.install().active
    cfg = tiny.tiny_config("default", vllm=NATIVE)
    if NATIVE:  # vllm.yml meshes have no ici knob for 'model': one device, every axis 1
        mesh = Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
    else:
        mesh = tiny.tiny_mesh(cfg)
    attn = wrap(tiny.tiny_attention(cfg, mesh, model_mode="autoregressive" if NATIVE else None, batch=TOKENS, seq=1))
    return cfg, mesh, attn


def _good(cfg):
    layout = paged.KVCacheLayout(PAGES, PAGE, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(PAGES, PAGE)
    seqs = [alloc.append("A", 20), alloc.append("C", 13)]
    md = paged.build_metadata(seqs, layout, max_num_tokens=TOKENS, max_num_seqs=4, pages_per_seq=2)
    return layout, alloc, md


def _step(m, x, pos, kv, md):
    return m(x, x, pos, None, model_mode="autoregressive", deterministic=True, kv_cache=kv, attention_metadata=md)


def _bad(md, **fields):
    """RaggedMetadata with some kernel arrays replaced (what a caller's own bookkeeping might produce)."""
    return dataclasses.replace(md, **fields)


def _cases(md):
    pi = list(md.page_indices)
    twice = pi[:]
    twice[1] = twice[0]  # request A's second page is its first again
    return {
        "page-listed-twice": _bad(md, page_indices=tuple(twice)),
        "distribution-counts-fewer": _bad(md, distribution=(0, 0, 1)),
    }


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", ["page-listed-twice", "distribution-counts-fewer", "negative-positions"])
def test_bad_metadata_through_the_adapter_is_refused(model, case, jit):
    cfg, mesh, attn = model
    layout, _, md = _good(cfg)
    cache = layout.allocate(1)[0]
    x = jnp.ones((TOKENS, 1, cfg.emb_dim), jnp.float32)
    pos = np.array(md.input_positions, np.int32)  # kernel order, padded to TOKENS rows
    if case == "negative-positions":
        pos[0] = -1
        bad = md
    else:
        bad = _cases(md)[case]
    args = (x, jnp.asarray(pos)[:, None], cache, bad.to_attention_metadata())
    run = nnx.jit(_step) if jit else _step
    with tiny.mesh_context(cfg, mesh):
        if not jit:
            with pytest.raises(InvalidArgumentError):
                run(attn, *args)
            return
        with pytest.raises(Exception) as e:  # the host check fails the step as it runs
            jax.block_until_ready(run(attn, *args))
    text = str(e.value)
    assert "InvalidArgumentError" in text and "Fix:" in text, text[:2000]


def test_the_same_good_step_runs(model):
    """The checks pass a correct step, eager and jitted, and the cache is written."""
    cfg, mesh, attn = model
    layout, _, md = _good(cfg)
    cache = layout.allocate(1)[0]
    x = jnp.asarray(np.random.default_rng(0).standard_normal((TOKENS, 1, cfg.emb_dim)).astype(np.float32))
    pos = jnp.asarray(np.asarray(md.input_positions, np.int32))[:, None]
    with tiny.mesh_context(cfg, mesh):
        out_e, kv_e = _step(attn, x, pos, cache, md.to_attention_metadata())
        out_j, kv_j = nnx.jit(_step)(attn, x, pos, cache, md.to_attention_metadata())
    np.testing.assert_allclose(np.asarray(out_e)[: md.num_tokens], np.asarray(out_j)[: md.num_tokens], atol=1e-5)
    np.testing.assert_allclose(np.asarray(kv_e), np.asarray(kv_j), atol=1e-5)  # eager vs fused projections
    assert np.abs(np.asarray(kv_e)).max() > 0


def test_metadata_kept_after_free_is_refused(model):
    cfg, mesh, attn = model
    layout, alloc, md = _good(cfg)
    attention_metadata = md.to_attention_metadata()
    alloc.free("A")
    cache = layout.allocate(1)[0]
    x = jnp.ones((TOKENS, 1, cfg.emb_dim), jnp.float32)
    pos = jnp.zeros((TOKENS, 1), jnp.int32)
    with tiny.mesh_context(cfg, mesh), pytest.raises(StaleSliceError, match="'A' was freed"):
        _step(attn, x, pos, cache, attention_metadata)


def test_metadata_for_another_page_size_is_refused(model):
    cfg, mesh, attn = model
    _, _, md = _good(cfg)
    cache8 = paged.KVCacheLayout(2 * PAGES, PAGE // 2, cfg.num_kv_heads, cfg.head_dim, "float32").allocate(1)[0]
    x = jnp.ones((TOKENS, 1, cfg.emb_dim), jnp.float32)
    pos = jnp.zeros((TOKENS, 1), jnp.int32)
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentError, match="built for another cache"):
        _step(attn, x, pos, cache8, md.to_attention_metadata())
