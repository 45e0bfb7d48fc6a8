"""An independent float64 dense attention for a ragged paged batch: the yardstick for the RPA kernel.

Why independent: a reference that reused the product's layout or metadata code would share
its bugs. This module re-derives everything from the documented cache layout (see
`maxtext_compat.paged.layout`'s docstring): it decodes cached K/V by hand, writes the new K/V
at positions [kv_len - q_len, kv_len), and computes causal (optionally sliding-window,
soft-capped, sink-augmented) softmax attention in float64 numpy, GQA by head groups.
It returns the outputs and the cache the kernel should leave behind. Tests only; never on a
product path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from maxtext_compat.paged.layout import KVCacheLayout


@dataclass(frozen=True)
class ReferenceResult:
    out: np.ndarray  # float64 [num_tokens, num_q_heads, head_dim], kernel token order
    kv_cache: np.ndarray  # the expected cache after the step, in the cache's dtype and shape


def _meta(metadata: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if hasattr(metadata, "kv_lens"):
        names = ("kv_lens", "page_indices", "cu_q_lens", "distribution")
    else:  # tpu-inference AttentionMetadata
        names = ("seq_lens", "block_tables", "query_start_loc", "request_distribution")
    return tuple(np.asarray(getattr(metadata, n), np.int64) for n in names)  # type: ignore[return-value]


def reference_ragged_attention(
    q: Any,
    k: Any,
    v: Any,
    kv_cache: Any,
    metadata: Any,
    layout: KVCacheLayout,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    attention_sink: Any = None,
    use_causal_mask: bool = True,
    update_kv_cache: bool = True,
) -> ReferenceResult:
    """Dense float64 attention of the batch `metadata` describes (RaggedMetadata or AttentionMetadata).

    q [T, Nq, D], k/v [T, Nkv, D] in kernel token order; `layout` supplies only plain numbers
    (heads, head_dim, tp, packing, whether the hd64 layout is used).
    """
    kv_lens, page_indices, cu, dist = _meta(metadata)
    cache = np.asarray(kv_cache)
    num_pages, page_size, combined, packing, lanes = cache.shape
    rows = cache.reshape(num_pages, page_size, combined * packing, lanes)  # a view: combined row = a*packing + p
    q64 = np.asarray(q).astype(np.float64)
    k_new, v_new = np.asarray(k), np.asarray(v)
    num_q_heads, head_dim = q64.shape[1], q64.shape[2]
    heads = layout.num_kv_heads
    tp = layout.tp
    stored_heads = max(heads, tp)  # KV heads are repeated up to tp when there are fewer
    repeat = stored_heads // heads
    per_shard = stored_heads // tp
    rows_per_shard = combined * packing // tp
    hd64 = layout.kernel == "hd64"

    def where(stored_head: int, kind: str) -> tuple[int, int]:
        shard, local = divmod(stored_head, per_shard)
        base = shard * rows_per_shard
        if hd64:
            return base + local, (0 if kind == "k" else head_dim)
        return base + 2 * local + (0 if kind == "k" else 1), 0

    def gather(page_ids: np.ndarray, slots: np.ndarray, kind: str) -> np.ndarray:
        out = np.empty((len(slots), heads, head_dim), np.float64)
        for h in range(heads):
            row, lane = where(h * repeat, kind)
            out[:, h] = rows[page_ids, slots, row, lane : lane + head_dim].astype(np.float64)
        return out

    expected = cache.copy()
    expected_rows = expected.reshape(num_pages, page_size, combined * packing, lanes)
    pages_per_seq = len(page_indices) // len(kv_lens)
    group = num_q_heads // heads
    num_tokens = int(cu[dist[2]])
    out = np.zeros((num_tokens, num_q_heads, head_dim), np.float64)
    sink = None if attention_sink is None else np.asarray(attention_sink).astype(np.float64)

    for s in range(int(dist[2])):
        start, stop = int(cu[s]), int(cu[s + 1])
        q_len, kv_len = stop - start, int(kv_lens[s])
        context = kv_len - q_len
        pages = page_indices[s * pages_per_seq : (s + 1) * pages_per_seq]
        positions = np.arange(kv_len)
        page_ids, slots = pages[positions // page_size], positions % page_size
        keys = np.concatenate([gather(page_ids[:context], slots[:context], "k"), k_new[start:stop].astype(np.float64)])
        vals = np.concatenate([gather(page_ids[:context], slots[:context], "v"), v_new[start:stop].astype(np.float64)])
        q_pos = context + np.arange(q_len)[:, None]
        k_pos = np.arange(kv_len)[None, :]
        allowed = q_pos >= k_pos if use_causal_mask else np.ones((q_len, kv_len), bool)
        if sliding_window is not None:
            allowed &= q_pos < k_pos + sliding_window
        for h in range(num_q_heads):
            logits = q64[start:stop, h] @ keys[:, h // group].T * sm_scale
            if soft_cap is not None:
                logits = soft_cap * np.tanh(logits / soft_cap)
            logits = np.where(allowed, logits, -np.inf)
            top = logits.max(axis=-1, keepdims=True)
            if sink is not None:
                top = np.maximum(top, sink[h])
            weights = np.exp(logits - top)
            denom = weights.sum(axis=-1, keepdims=True)
            if sink is not None:
                denom = denom + np.exp(sink[h] - top)
            out[start:stop, h] = (weights / denom) @ vals[:, h // group]
        if update_kv_cache:
            for j in range(q_len):
                pos = context + j
                page, slot = pages[pos // page_size], pos % page_size
                expected_rows[page, slot] = 0  # the kernel writes whole token rows, padding zeroed
                for stored in range(stored_heads):
                    for kind, src in (("k", k_new), ("v", v_new)):
                        row, lane = where(stored, kind)
                        expected_rows[page, slot, row, lane : lane + head_dim] = src[start + j, stored // repeat]
    return ReferenceResult(out, expected)


# --------------------------------------------------------------------------------------------
# Random ragged steps for tests and benchmarks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RaggedStep:
    """One random step: metadata, q/k/v in kernel order and a cache holding every request's context."""

    layout: KVCacheLayout
    metadata: Any  # maxtext_compat.paged.RaggedMetadata
    q: Any
    k: Any
    v: Any
    kv_cache: Any
    context_k: tuple[np.ndarray, ...]  # per caller request: K of the cached tokens [context, heads, head_dim]
    context_v: tuple[np.ndarray, ...]


def make_ragged_step(
    layout: KVCacheLayout,
    lens: list[tuple[int, int]],
    *,
    num_q_heads: int,
    max_num_tokens: int | None = None,
    max_num_seqs: int | None = None,
    pages_per_seq: int | None = None,
    seed: int = 0,
    poison: bool = True,
) -> RaggedStep:
    """A batch of (q_len, kv_len) requests in caller order, pages shuffled over the cache.

    The cache is random everywhere (stale data, padding lanes, unused pages) except each
    request's context, written consistently to every replica; with `poison` the padding rows of
    q/k/v are NaN so a kernel that reads or forgets them shows it.
    """
    import jax.numpy as jnp

    from maxtext_compat.paged import PageAllocator, build_metadata, write_kv

    rng = np.random.default_rng(seed)
    alloc = PageAllocator(layout.num_pages, layout.page_size, seed=seed)
    seqs = []
    for rid, (q_len, kv_len) in enumerate(lens):
        if kv_len > q_len:
            alloc.append(rid, kv_len - q_len)
        seqs.append(alloc.append(rid, q_len))
    md = build_metadata(seqs, layout, max_num_tokens=max_num_tokens, max_num_seqs=max_num_seqs,
                        pages_per_seq=pages_per_seq)  # fmt: skip
    dtype = layout.dtype

    def rnd(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    cache = jnp.asarray(rnd(*layout.shape)).astype(dtype)
    ctx_k, ctx_v = [], []
    for s in seqs:
        kc = np.asarray(jnp.asarray(rnd(s.context_len, layout.num_kv_heads, layout.head_dim)).astype(dtype))
        vc = np.asarray(jnp.asarray(rnd(s.context_len, layout.num_kv_heads, layout.head_dim)).astype(dtype))
        if s.context_len:
            cache = write_kv(cache, layout, s.pages, 0, kc, vc)
        ctx_k.append(kc)
        ctx_v.append(vc)
    n = md.num_tokens
    pad = float("nan") if poison else 0.0

    def rows(heads: int) -> Any:
        caller = jnp.asarray(rnd(n, heads, layout.head_dim)).astype(dtype)
        return md.to_kernel_order(caller, pad_value=pad)

    return RaggedStep(
        layout, md, rows(num_q_heads), rows(layout.num_kv_heads), rows(layout.num_kv_heads),
        jnp.asarray(cache), tuple(ctx_k), tuple(ctx_v),
    )  # fmt: skip
