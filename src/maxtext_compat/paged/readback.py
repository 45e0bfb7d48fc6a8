"""Read one request's K/V back out of a paged cache (and write dense K/V into one), on the host.

Why: the cache layout interleaves K and V, pads heads and lanes, shards heads and may repeat
them under tensor parallelism; tests, debugging and anyone importing a prompt's KV need to
get [tokens, kv_heads, head_dim] arrays out (or in) without re-deriving all of that. These
helpers copy to numpy: they are for inspection and set-up, never for the serving path (the
kernel writes the cache itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from maxtext_compat.contract import Array, IntSequence, NonNegativeInt, checked
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.paged.layout import KVCacheLayout, cdiv
from maxtext_compat.paged.metadata import RaggedMetadata


def _rows(layout: KVCacheLayout, pages: Sequence[int], start: int, stop: int) -> tuple[Any, Any]:
    """(page id, slot) index arrays of token positions [start, stop)."""
    import numpy as np

    if not 0 <= start <= stop:
        raise InvalidArgumentError(
            "token range must satisfy 0 <= start <= stop",
            argument="start/stop",
            expected="0 <= start <= stop",
            found=f"start={start}, stop={stop}",
            fix="pass a start position >= 0 and no later than the end position (kv_len, or start + token rows)",
        )
    need = cdiv(stop, layout.page_size)
    if len(pages) < need:
        raise InvalidArgumentError(
            "too few pages for the token range",
            argument="pages",
            expected=f">= {need} pages for {stop} tokens",
            found=f"{len(pages)} pages",
            fix=f"pass all the request's pages (PageAllocator.pages(request_id)), at least {need} of "
            f"{layout.page_size} tokens, or read fewer tokens",
        )
    pos = np.arange(start, stop)
    page_ids = np.asarray(pages, np.int64)[pos // layout.page_size]
    return page_ids, pos % layout.page_size


def _flat(kv_cache: Any, layout: KVCacheLayout) -> Any:
    import numpy as np

    layout.check_cache(kv_cache)
    p, s, c, k, d = layout.shape
    return np.asarray(kv_cache).reshape(p, s, c * k, d)


@checked
def read_kv_replicas(
    kv_cache: Array, layout: KVCacheLayout, pages: IntSequence, kv_len: NonNegativeInt, *, start: NonNegativeInt = 0
) -> tuple[Any, Any]:
    """K and V of positions [start, kv_len): arrays [replication, tokens, num_kv_heads, head_dim]."""
    import numpy as np

    flat = _flat(kv_cache, layout)
    page_ids, slots = _rows(layout, pages, start, kv_len)
    tokens = flat[page_ids, slots]  # [T, combined rows, lanes]
    hd = layout.head_dim
    out = {}
    for kind in ("k", "v"):
        per_head = []
        for h in range(layout.num_kv_heads):
            per_head.append(np.stack([tokens[:, row, lane : lane + hd] for row, lane in layout.slots(h, kind)]))
        out[kind] = np.stack(per_head, axis=2)  # [R, T, H, D]
    return out["k"], out["v"]


@checked
def read_kv(
    kv_cache: Array, layout: KVCacheLayout, pages: IntSequence, kv_len: NonNegativeInt, *, start: NonNegativeInt = 0
) -> tuple[Any, Any]:
    """K and V of positions [start, kv_len) of a request: numpy [tokens, num_kv_heads, head_dim].

    Raises if the copies of a head repeated for tensor parallelism disagree (they never should).
    """
    import numpy as np

    k, v = read_kv_replicas(kv_cache, layout, pages, kv_len, start=start)
    for name, arr in (("K", k), ("V", v)):
        if arr.shape[0] > 1 and not all(np.array_equal(arr[0], arr[r], equal_nan=True) for r in range(1, len(arr))):
            raise InvalidArgumentError(
                f"the repeated copies of a {name} head differ in the cache",
                argument="kv_cache",
                expected=f"{layout.replication} identical copies per head (tp={layout.tp})",
                found="copies that differ",
                fix="write the cache only through the kernel or write_kv",
            )
    return k[0], v[0]


@checked
def read_sequence(kv_cache: Array, layout: KVCacheLayout, metadata: RaggedMetadata, seq: int) -> tuple[Any, Any]:
    """K/V of kernel sequence `seq` of a step, all kv_lens[seq] positions."""
    if not 0 <= seq < metadata.num_seqs:
        raise InvalidArgumentError(
            "sequence index out of range",
            argument="seq",
            expected=f"[0, {metadata.num_seqs})",
            found=seq,
            fix=f"pass a kernel sequence index below metadata.num_seqs={metadata.num_seqs} "
            "(kernel order: decode sequences first)",
        )
    return read_kv(kv_cache, layout, metadata.pages_of(seq), metadata.kv_lens[seq])


@checked
def write_kv(
    kv_cache: Array, layout: KVCacheLayout, pages: IntSequence, start: NonNegativeInt, k: Array, v: Array
) -> Any:
    """A numpy copy of the cache with k/v [tokens, num_kv_heads, head_dim] at positions start.. (every replica).

    Only the heads' own lanes are written; padding stays as it was. Use it to seed a cache
    with a prompt's KV for tests; `jnp.asarray` (or device_put with the layout's sharding)
    the result.
    """
    import numpy as np

    k, v = np.asarray(k), np.asarray(v)
    want = (k.shape[0], layout.num_kv_heads, layout.head_dim)
    for name, arr in (("k", k), ("v", v)):
        if arr.shape != want:
            raise InvalidArgumentError(
                "K/V rows have the wrong shape",
                argument=name,
                expected=f"shape {want}",
                found=arr.shape,
                fix=f"pass {name} as [tokens, num_kv_heads={layout.num_kv_heads}, head_dim={layout.head_dim}] "
                "with as many token rows in k as in v",
            )
    flat = _flat(kv_cache, layout).copy()
    page_ids, slots = _rows(layout, pages, start, start + k.shape[0])
    hd = layout.head_dim
    for h in range(layout.num_kv_heads):
        for kind, arr in (("k", k), ("v", v)):
            for row, lane in layout.slots(h, kind):
                flat[page_ids, slots, row, lane : lane + hd] = arr[:, h].astype(flat.dtype)
    return flat.reshape(layout.shape)
