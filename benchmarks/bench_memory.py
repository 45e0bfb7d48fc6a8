"""Memory: KV bytes a paged cache holds for a ragged batch vs MaxText's own contiguous KV cache.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 .envs/maxtext-0.2.5/bin/python benchmarks/bench_memory.py

Why: MaxText's non-vLLM decode reserves `max_target_length` tokens of K and V per batch slot
whatever each request's length; a paged cache holds only the pages the requests use. The
contiguous figure is measured, not computed: the bytes of the key/value cache variables of
MaxText 0.2.5's own autoregressive Transformer (nnx.eval_shape: no memory is allocated) for a
batch of 8 at max_target_length 1024. The paged figure is the pages `PageAllocator` hands out
for the same lengths times the RPA cache's real page size (`KVCacheLayout.bytes_per_page`).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import run_all

MAX_LEN, PREFILL_LEN, PAGE_SIZE = 1024, 512, 16
BATCHES = {
    "8 chats, 40 to 1,000 tokens": [40, 90, 150, 230, 330, 480, 700, 1000],
    "8 short replies, 12 to 64 tokens": [12, 20, 28, 33, 41, 50, 57, 64],
    "1 long + 7 short": [1020, 8, 16, 16, 30, 40, 70, 100],
}


def contiguous_kv_bytes(batch: int) -> tuple[int, int, Any]:
    """(bytes of MaxText's own K/V cache variables for `batch` slots, number of layers, the config)."""
    import jax
    from flax import nnx

    from maxtext_compat.testing import tiny

    cfg = tiny.tiny_config("default", max_target_length=MAX_LEN, max_prefill_predict_length=PREFILL_LEN,
                           per_device_batch_size=batch)  # fmt: skip
    mesh = tiny.tiny_mesh(cfg)
    transformer = tiny.api().cls("transformer")
    with tiny.mesh_context(cfg, mesh):
        abstract = nnx.eval_shape(
            lambda: transformer(cfg, mesh, quant=None, model_mode="autoregressive", rngs=nnx.Rngs(params=0, dropout=1))
        )
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(abstract, nnx.Cache))[0]:
        if re.search(r"'cached_(prefill|ar)_(key|value)'", jax.tree_util.keystr(path)):  # not lengths/indices
            total += leaf.size * leaf.dtype.itemsize
    return total, int(cfg.num_decoder_layers), cfg


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    from maxtext_compat import paged

    batch = len(next(iter(BATCHES.values())))
    contiguous, layers, cfg = contiguous_kv_bytes(batch)
    rows = []
    for name, lens in BATCHES.items():
        pages = sum(paged.layout.cdiv(n, PAGE_SIZE) for n in lens)
        alloc = paged.PageAllocator(pages, PAGE_SIZE)
        used = sum(len(alloc.allocate(i, n)) for i, n in enumerate(lens))
        layout = paged.KVCacheLayout(used, PAGE_SIZE, int(cfg.num_kv_heads), int(cfg.head_dim), "float32")
        held = used * layout.bytes_per_page * layers
        how = (
            f"lengths {lens}; paged: {used} pages x {layout.bytes_per_page:,} B x {layers} layers; contiguous: "
            f"MaxText 0.2.5's cached_{{prefill,ar}}_{{key,value}} for batch {batch}, max_target_length {MAX_LEN}"
        )
        rows.append(run_all.row(f"memory · KV bytes, {name}", held, "B", how, native=contiguous))
        print(f"  {name}: paged {held:,} B vs contiguous {contiguous:,} B", file=sys.stderr)
    return rows


if __name__ == "__main__":
    run_all.emit(run())
