"""KVCacheLayout agrees with the installed tpu-inference: shapes, sharding, where K and V live."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

# tpu-inference's own layout functions: once per tpu-inference release (0.2.3 has maxtext-0.2.5's pins).
pytestmark = pytest.mark.envs("maxtext-0.2.3", "maxtext-0.2.1")

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from maxtext_compat import paged  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError  # noqa: E402

GRID = [
    (heads, hd, dtype, tp)
    for heads, hd, dtype, tp in itertools.product((1, 2, 4), (64, 96, 128, 256), ("float32", "bfloat16"), (1, 2, 4))
    if (heads % tp == 0 or tp % heads == 0)
]


@pytest.fixture(scope="module")
def tpi():
    from tpu_inference.kernels.ragged_paged_attention.v3 import kernel, kernel_hd64
    from tpu_inference.runner import kv_cache
    from tpu_inference.utils import get_num_kv_heads_by_tp

    return kernel, kernel_hd64, kv_cache, get_num_kv_heads_by_tp


@pytest.mark.parametrize(("heads", "hd", "dtype", "tp"), GRID)
def test_shape_matches_tpu_inference(tpi, heads, hd, dtype, tp):
    kernel, kernel_hd64, kv_cache, kv_heads_by_tp = tpi
    layout = paged.KVCacheLayout(6, 16, heads, hd, dtype, tp=tp)
    assert layout.cache_kv_heads == kv_heads_by_tp(heads, tp)
    mesh = paged.make_mesh(tp)
    theirs = kv_cache.get_kv_cache_shape_with_mesh(mesh, 6, 16, layout.cache_kv_heads, hd, jnp.dtype(dtype))
    assert layout.shape == tuple(theirs)
    if tp == 1:
        own = (kernel_hd64 if hd == 64 else kernel).get_kv_cache_shape(6, 16, heads, hd, jnp.dtype(dtype))
        assert layout.shape == tuple(own)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sharded_allocation(tp):
    layout = paged.KVCacheLayout(6, 16, 2, 128, "bfloat16", tp=tp)
    caches = layout.allocate(3, mesh=paged.make_mesh(tp))
    assert len(caches) == 3
    for c in caches:
        assert c.shape == layout.shape and c.dtype == jnp.bfloat16
        assert c.sharding.shard_shape(c.shape) == layout.shard_shape
        assert len(c.sharding.device_set) == tp
        assert not np.asarray(c.astype(jnp.float32)).any()
    assert layout.allocate()[0].shape == layout.shape


def test_allocation_rejects_a_mesh_of_another_tp():
    with pytest.raises(InvalidArgumentError, match="tp"):
        paged.KVCacheLayout(6, 16, 2, 128, tp=2).allocate(mesh=paged.make_mesh(1))


def _their_cache(tpi, layout, k, v):
    """Cache rows for tokens 0..T-1 of page 0.. built with tpu-inference's own merge_kv, shard by shard."""
    kernel, kernel_hd64, _, _ = tpi
    merge = kernel_hd64.merge_kv if layout.kernel == "hd64" else kernel.merge_kv
    k = jnp.repeat(jnp.asarray(k), layout.replication, axis=1)
    v = jnp.repeat(jnp.asarray(v), layout.replication, axis=1)
    per = layout.heads_per_shard
    shards = [merge(k[:, s * per : (s + 1) * per], v[:, s * per : (s + 1) * per]) for s in range(layout.tp)]
    merged = np.asarray(jnp.concatenate(shards, axis=1))  # [T, combined, packing, lanes(hd64: 2*64)]
    cache = np.zeros(layout.shape, merged.dtype)
    t = merged.shape[0]
    cache[: t // layout.page_size, :, :, :, : merged.shape[-1]] = merged.reshape(
        t // layout.page_size, layout.page_size, *merged.shape[1:]
    )
    return cache


@pytest.mark.parametrize(
    ("heads", "hd", "dtype", "tp"),
    [
        (2, 128, "float32", 1),
        (3, 96, "bfloat16", 1),
        (2, 64, "bfloat16", 1),
        (2, 64, "float32", 2),
        (1, 128, "bfloat16", 4),
    ],
)
def test_read_and_write_agree_with_merge_kv(tpi, heads, hd, dtype, tp):
    layout = paged.KVCacheLayout(4, 16, heads, hd, dtype, tp=tp)
    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.standard_normal((32, heads, hd)), dtype)
    v = jnp.asarray(rng.standard_normal((32, heads, hd)), dtype)
    theirs = _their_cache(tpi, layout, k, v)
    got_k, got_v = paged.read_kv(theirs, layout, [0, 1], 32)
    np.testing.assert_array_equal(got_k, np.asarray(k))
    np.testing.assert_array_equal(got_v, np.asarray(v))
    ours = paged.write_kv(np.zeros(layout.shape, theirs.dtype), layout, [0, 1], 0, k, v)
    np.testing.assert_array_equal(ours, theirs)


def test_read_kv_spans_shuffled_pages_and_checks_replicas():
    layout = paged.KVCacheLayout(8, 4, 1, 128, "float32", tp=2)
    rng = np.random.default_rng(1)
    k, v = rng.standard_normal((2, 10, 1, 128)).astype(np.float32)
    cache = paged.write_kv(np.zeros(layout.shape, np.float32), layout, [5, 2, 7], 0, k, v)
    got = paged.read_kv(jnp.asarray(cache), layout, [5, 2, 7], 10, start=3)
    np.testing.assert_array_equal(got[0], k[3:])
    reps_k, _ = paged.read_kv_replicas(cache, layout, [5, 2, 7], 10)
    assert reps_k.shape == (2, 10, 1, 128)
    cache[5, 0, 0, 0, 0] += 1  # corrupt one replica of head 0's K
    with pytest.raises(InvalidArgumentError, match="copies"):
        paged.read_kv(cache, layout, [5, 2, 7], 10)


def test_layout_check_cache_names_the_problem():
    layout = paged.KVCacheLayout(4, 16, 2, 128, "float32")
    with pytest.raises(InvalidArgumentError) as info:
        layout.check_cache(jnp.zeros((4, 16, 2, 1, 128)))
    assert "(4, 16, 4, 1, 128)" in str(info.value.expected)
    with pytest.raises(InvalidArgumentError, match="dtype"):
        layout.check_cache(jnp.zeros(layout.shape, jnp.bfloat16))


def test_bytes_paged_vs_contiguous():
    layout = paged.KVCacheLayout(64, 16, 2, 128, "bfloat16")
    assert layout.bytes_per_token == 2 * 2 * 128 * 2  # K+V, 2 heads, 128 lanes, 2 bytes
    assert layout.nbytes == 64 * 16 * layout.bytes_per_token
