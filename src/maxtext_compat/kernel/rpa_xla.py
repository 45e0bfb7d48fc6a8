"""tpu-inference's ragged paged attention (RPA v3 and its head_dim-64 variant) in plain jax.numpy.

Why: on a CPU the real Pallas kernel only runs in TPU interpret mode, which simulates every DMA
and semaphore in Python: 200-400 ms per call, ~10 s per decode step of a 30-layer model. This
module computes what the kernel computes -- same arguments, same KV-cache layout, same writes,
same outputs, same returned cache -- as one jitted XLA program (a scatter for the new K/V, a
gather of every token's pages into a dense [tokens, max_kv_len] view, masked softmax), so XLA:CPU
runs it in well under a millisecond for serving shapes. The CPU serving shim (`cpu.serving`) puts
it behind `sharded_ragged_paged_attention` unless `MAXTEXT_COMPAT_RPA_KERNEL=pallas`; the real kernel is
what the kernel tests run, and `tests/compat/test_rpa_xla.py` holds the two together (outputs
f32 <= 1e-6, caches equal element for element).

Semantics copied from tpu-inference 0.32.0 `kernels/ragged_paged_attention/v3/kernel{,_hd64}.py`:
* cache layout: v3 `[pages, page_size, align(2H, packing)//packing, packing, align(D, 128)]`, row
  2h = K of head h, 2h+1 = V; hd64 `[pages, page_size, align(H, packing)//packing, packing, 128]`,
  K in lanes 0..63 and V in lanes 64..127 of row h. A written token row is the whole merged row
  (`merge_kv`), zero padding included; writes go to positions [kv_len - q_len, kv_len).
* sequences: distribution (d, p, n). v3 runs [0, d) as decode and [p, n) as mixed; [d, p) only
  with `chunk_prefill_size` (tpu-inference's wrapper never passes it), so without it those
  sequences are neither computed nor written -- as in the kernel. hd64 runs every sequence < n.
* output rows no sequence computes keep what the kernel's aliased output buffer holds: q's row
  (v3) or zeros (hd64: lanes 64..127 of q padded to 128 lanes).
* logits: q.k in float32, times sm_scale (and k_scale, q_scale), soft cap, then the mask
  (causal, kv_len, sliding window `q_pos < k_pos + window`) with the kernel's mask value;
  sink logits (hd64) join the softmax denominator. v3 keeps its softmax statistics in
  `out_dtype` (bfloat16 for bfloat16 q), hd64 in float32; this module does the same.
Numerics differ from the kernel's blocked online softmax only by summation order (float32:
~1e-7); a kernel with several KV blocks per sequence in bfloat16 rounds its running sums per
block, which a single dense softmax does not (bfloat16 outputs agree to bfloat16 precision).

Assumes validated metadata (`maxtext_compat.paged.check_metadata`, run by the dispatcher):
decode sequences have q_len 1, 0 < q_len <= kv_len, pages in range, no two tokens write one slot.
Block-size and VMEM arguments are accepted and ignored (there are no blocks here).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from maxtext_compat.errors import InvalidArgumentError

HD64_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # kernel_hd64.DEFAULT_MASK_VALUE

_V3_STATIC = (
    "use_causal_mask", "update_kv_cache", "skip_kv_mask", "sm_scale", "sliding_window", "soft_cap",
    "out_dtype", "mask_value", "q_scale", "k_scale", "v_scale", "chunk_prefill_size", "d_block_sizes",
    "p_block_sizes", "m_block_sizes", "vmem_limit_bytes", "debug_mode", "disable_bounds_checks",
    "disable_semaphore_checks",
)  # fmt: skip
_HD64_STATIC = (
    "sm_scale", "sliding_window", "soft_cap", "mask_value", "q_scale", "k_scale", "v_scale",
    "chunk_prefill_size", "num_kv_pages_per_block", "num_queries_per_block", "vmem_limit_bytes", "debug_mode",
)  # fmt: skip


def _align(x: int, n: int) -> int:
    return -(-x // n) * n


def _refuse_debug(debug_mode: bool) -> None:
    if debug_mode:
        raise InvalidArgumentError(
            "debug_mode makes the Pallas kernel skip its DMAs and compute; the XLA kernel has neither",
            argument="debug_mode",
            expected="False with MAXTEXT_COMPAT_RPA_KERNEL=xla",
            found=True,
            fix="run the real kernel (MAXTEXT_COMPAT_RPA_KERNEL=pallas) to use debug_mode",
        )


# --------------------------------------------------------------------------------------------
# Shared core
# --------------------------------------------------------------------------------------------


def _tokens(
    num_tokens: int, kv_lens: Any, cu_q_lens: Any, distribution: Any, *, all_segments: bool
) -> tuple[Any, Any, Any, Any]:
    """Per token row: (sequence, position in its sequence's KV, that sequence's kv_len, computed?)."""
    max_num_seqs = kv_lens.shape[0]
    n = distribution[2]
    tok = jnp.arange(num_tokens, dtype=jnp.int32)
    real = jnp.arange(max_num_seqs, dtype=jnp.int32) < n
    ends = cu_q_lens[1:]
    # A token's sequence is the number of real sequences that end at or before it.
    seq = jnp.sum((ends[None, :] <= tok[:, None]) & real[None, :], axis=1, dtype=jnp.int32)
    active = tok < jnp.take(cu_q_lens, n, mode="clip")
    seq = jnp.minimum(seq, max_num_seqs - 1)
    start = jnp.take(cu_q_lens, seq, mode="clip")
    q_len = jnp.take(cu_q_lens, seq + 1, mode="clip") - start
    kv_len = jnp.take(kv_lens, seq, mode="clip")
    pos = kv_len - q_len + (tok - start)
    if not all_segments:  # v3 without chunk_prefill_size: the prefill-only segment [d, p) is never run
        active = active & ((seq < distribution[0]) | (seq >= distribution[1]))
    return seq, pos, kv_len, active


def _write_and_gather(
    kv_cache: Any, merged: Any, page_indices: Any, pages_per_seq: int, seq: Any, pos: Any, write: Any
) -> tuple[Any, Any]:
    """Scatter the merged token rows into their slots (one scatter); gather each token's sequence.

    Returns (new cache, rows [tokens, pages_per_seq * page_size, combined rows, lanes]) where the
    rows are read from the new cache: with validated metadata every slot a sequence reads holds
    either its cached context or a token this very call wrote, exactly what the kernel reads.

    The scatter and the gather index the cache in its own 5-D shape (page, offset): a reshape to
    [slots, rows, lanes] first merged the size-1 packing axis away, and XLA:CPU then gave the
    scatter a layout of its own and copied the whole cache twice per layer and step (in, and back
    to the donated buffer's layout): 30 x 2 x 15 MB per decode step of SmolLM2 served with a
    610-page cache, ~115 of its ~460 ms (tests/compat/test_rpa_xla.py counts the copies).
    """
    num_pages, page_size = kv_cache.shape[:2]
    safe = jnp.maximum(pos, 0)
    page = jnp.take(page_indices, seq * pages_per_seq + safe // page_size, mode="clip")
    page = jnp.where(write, page, num_pages)  # out of range: dropped
    update = merged.reshape(merged.shape[0], *kv_cache.shape[2:])  # combined row = a * packing + p
    new_cache = kv_cache.at[page, safe % page_size].set(update.astype(kv_cache.dtype), mode="drop")
    max_kv_len = pages_per_seq * page_size
    lpos = jnp.arange(max_kv_len, dtype=jnp.int32)
    pages = jnp.take(page_indices, seq[:, None] * pages_per_seq + lpos[None, :] // page_size, mode="clip")
    rows = new_cache.at[jnp.clip(pages, 0, num_pages - 1), (lpos % page_size)[None, :]].get(mode="clip")
    return new_cache, rows.reshape(*rows.shape[:2], -1, kv_cache.shape[-1])  # [tokens, max_kv_len, rows, lanes]


def _mask(pos: Any, kv_len: Any, max_kv_len: int, *, causal: bool, sliding_window: int | None) -> Any:
    """[tokens, max_kv_len]: which KV positions each token's query sees."""
    lpos = jnp.arange(max_kv_len, dtype=jnp.int32)[None, :]
    mask = lpos < kv_len[:, None]
    if causal:
        mask = mask & (lpos <= pos[:, None])
    if sliding_window is not None:
        mask = mask & (pos[:, None] < lpos + sliding_window)
    return mask


def _scale_q(q: Any, kv_dtype: Any, q_scale: float | None) -> Any:
    """The kernels' q quantisation: q / q_scale, clipped to the KV dtype's range, cast to it."""
    if q_scale is None:
        return q
    q = q / q_scale
    if jnp.issubdtype(kv_dtype, jnp.floating):
        info = jnp.finfo(kv_dtype)
        q = jnp.clip(q, float(info.min), float(info.max))
    return q.astype(kv_dtype)


def _attend(
    q: Any,  # [T, H, G, D]
    k: Any,  # [T, L, H, D]
    v: Any,  # [T, L, H, D]
    mask: Any,  # [T, L]
    *,
    logit_scales: tuple[float, ...],
    soft_cap: float | None,
    mask_value: float,
    v_scale: float | None,
    stats_dtype: Any,
    sink: Any = None,  # [H, G] float32 or None
    exact_div: bool,
) -> Any:
    """Masked softmax attention; returns [T, H, G, D] in stats_dtype (before the output cast)."""
    s = jnp.einsum("thgd,tlhd->thgl", q, k, preferred_element_type=jnp.float32)
    for scale in logit_scales:
        s = s * scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    m4 = mask[:, None, None, :]
    s = jnp.where(m4, s, mask_value)
    # Masked positions may hold anything (stale pages, NaN): zero V there so p = 0 stays 0.
    v = jnp.where(mask[:, :, None, None], v, jnp.zeros((), v.dtype))
    m = jnp.max(s, axis=-1, keepdims=True).astype(stats_dtype)
    if sink is not None:
        m = jnp.maximum(m, sink[None, :, :, None].astype(stats_dtype))
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True, dtype=stats_dtype)
    if sink is not None:
        denom = denom + jnp.exp(sink[None, :, :, None] - m).astype(stats_dtype)
    pv = jnp.einsum("thgl,tlhd->thgd", p, v.astype(jnp.float32), preferred_element_type=jnp.float32)
    if v_scale is not None:
        pv = pv * v_scale
    pv = pv.astype(stats_dtype)
    denom = jnp.broadcast_to(denom, pv.shape)
    if exact_div:
        return jax.lax.div(pv, denom)
    # hd64 with a non-f32 q: acc * pltpu.reciprocal(l, approx=True); Pallas lowers the approximate
    # reciprocal off-TPU as a bfloat16 reciprocal, which is what the interpret-mode kernel computes.
    return pv * jnp.reciprocal(denom.astype(jnp.bfloat16)).astype(jnp.float32)


# --------------------------------------------------------------------------------------------
# The two kernels
# --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=_V3_STATIC)
def ragged_paged_attention(
    queries: Any,  # [max_num_tokens, num_q_heads, head_dim]
    keys: Any,  # [max_num_tokens, num_kv_heads, head_dim]
    values: Any,  # [max_num_tokens, num_kv_heads, head_dim]
    kv_cache: Any,  # [pages, page_size, align(2 * num_kv_heads, packing) // packing, packing, align(head_dim, 128)]
    kv_lens: Any,  # i32[max_num_seqs]
    page_indices: Any,  # i32[max_num_seqs * pages_per_seq]
    cu_q_lens: Any,  # i32[max_num_seqs + 1]
    distribution: Any,  # i32[3]
    *,
    use_causal_mask: bool = True,
    update_kv_cache: bool = True,
    skip_kv_mask: bool = False,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    out_dtype: Any = None,
    mask_value: float | None = None,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    chunk_prefill_size: int | None = None,
    d_block_sizes: Any = None,
    p_block_sizes: Any = None,
    m_block_sizes: Any = None,
    vmem_limit_bytes: int | None = None,
    debug_mode: bool = False,
    disable_bounds_checks: bool = True,
    disable_semaphore_checks: bool = True,
) -> tuple[Any, Any]:
    """The v3 kernel's `ragged_paged_attention` (same signature); returns (out, new kv_cache)."""
    _refuse_debug(debug_mode)
    num_tokens, num_q_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    if out_dtype is None:
        out_dtype = jnp.float32 if queries.dtype == jnp.float32 else jnp.bfloat16
    if mask_value is None:
        mask_value = float(jnp.finfo(out_dtype).min)
    pages_per_seq = page_indices.shape[0] // kv_lens.shape[0]
    lanes = kv_cache.shape[-1]
    packing = kv_cache.shape[3]
    seq, pos, kv_len, active = _tokens(
        num_tokens, kv_lens, cu_q_lens, distribution, all_segments=chunk_prefill_size is not None
    )
    # merge_kv: [T, H, 2D] -> [T, 2H, D] (row 2h = K, 2h+1 = V), zero-padded to the packing and 128 lanes.
    merged = jnp.concatenate([keys, values], axis=-1).reshape(num_tokens, 2 * num_kv_heads, head_dim)
    merged = jnp.pad(merged, ((0, 0), (0, _align(2 * num_kv_heads, packing) - 2 * num_kv_heads), (0, lanes - head_dim)))
    new_cache, rows = _write_and_gather(
        kv_cache, merged.astype(kv_cache.dtype), page_indices, pages_per_seq, seq, pos, active & update_kv_cache
    )
    k = rows[:, :, 0 : 2 * num_kv_heads : 2, :head_dim]
    v = rows[:, :, 1 : 2 * num_kv_heads : 2, :head_dim]
    q = _scale_q(queries.reshape(num_tokens, num_kv_heads, group, head_dim), k.dtype, q_scale)
    s_scale = sm_scale
    if k_scale is not None:
        s_scale *= k_scale
    if q_scale is not None:
        s_scale *= q_scale
    mask = _mask(pos, kv_len, rows.shape[1], causal=use_causal_mask, sliding_window=sliding_window)
    stats = jnp.dtype(out_dtype)
    out = _attend(
        q, k, v, mask, logit_scales=(s_scale,), soft_cap=soft_cap, mask_value=mask_value, v_scale=v_scale,
        stats_dtype=stats, exact_div=True,
    )  # fmt: skip
    out = out.astype(out_dtype).astype(queries.dtype).reshape(num_tokens, num_q_heads, head_dim)
    # Rows no sequence computes keep the aliased output buffer's content: q's row.
    return jnp.where(active[:, None, None], out, queries), new_cache


@functools.partial(jax.jit, static_argnames=_HD64_STATIC)
def ragged_paged_attention_hd64(
    queries: Any,  # [max_num_tokens, num_q_heads, 64]
    keys: Any,  # [max_num_tokens, num_kv_heads, 64]
    values: Any,  # [max_num_tokens, num_kv_heads, 64]
    kv_cache: Any,  # [pages, page_size, align(num_kv_heads, packing) // packing, packing, 128]
    kv_lens: Any,
    page_indices: Any,
    cu_q_lens: Any,
    distribution: Any,
    attention_sink: Any = None,  # f32[num_q_heads]
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = HD64_MASK_VALUE,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    chunk_prefill_size: int | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
    debug_mode: bool = False,
) -> tuple[Any, Any]:
    """The head_dim-64 kernel's `ragged_paged_attention_hd64` (same signature); returns (out, new kv_cache)."""
    _refuse_debug(debug_mode)
    if mask_value is None:
        mask_value = HD64_MASK_VALUE
    num_tokens, num_q_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    pages_per_seq = page_indices.shape[0] // kv_lens.shape[0]
    packing = kv_cache.shape[3]
    seq, pos, kv_len, active = _tokens(num_tokens, kv_lens, cu_q_lens, distribution, all_segments=True)
    # merge_kv: [T, H, 128] with K in lanes 0..63 and V in 64..127, heads zero-padded to the packing.
    merged = jnp.concatenate([keys, values], axis=-1)
    merged = jnp.pad(merged, ((0, 0), (0, _align(num_kv_heads, packing) - num_kv_heads), (0, 0)))
    new_cache, rows = _write_and_gather(
        kv_cache, merged.astype(kv_cache.dtype), page_indices, pages_per_seq, seq, pos, active
    )
    k = rows[:, :, :num_kv_heads, :head_dim]
    v = rows[:, :, :num_kv_heads, head_dim : 2 * head_dim]
    q = _scale_q(queries.reshape(num_tokens, num_kv_heads, group, head_dim), k.dtype, q_scale)
    scales = (sm_scale, *(x for x in (k_scale, q_scale) if x is not None))
    mask = _mask(pos, kv_len, rows.shape[1], causal=True, sliding_window=sliding_window)
    sink = None if attention_sink is None else attention_sink.astype(jnp.float32).reshape(num_kv_heads, group)
    out = _attend(
        q, k, v, mask, logit_scales=scales, soft_cap=soft_cap, mask_value=mask_value, v_scale=v_scale,
        stats_dtype=jnp.dtype(jnp.float32), sink=sink, exact_div=queries.dtype == jnp.float32,
    )  # fmt: skip
    out = out.astype(queries.dtype).reshape(num_tokens, num_q_heads, head_dim)
    # Rows no sequence computes keep the aliased buffer's lanes 64..127 of q padded to 128: zeros.
    return jnp.where(active[:, None, None], out, jnp.zeros((), queries.dtype)), new_cache
