"""Validate raw RPA inputs (arrays) before the kernel sees them.

Why: inside the kernel a wrong shape is a ValueError from deep in a trace, and a wrong value
(page id out of range, q_len > kv_len) is silent memory corruption on TPU. The dispatcher
runs these checks on every call: shapes and dtypes always (they are static, also under jit),
metadata values only when the arrays are concrete (a tracer has no values to check).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from maxtext_compat.contract import Array, PositiveInt, Rule, checked
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.paged.layout import KVCacheLayout, dtype_name, kv_heads_for_tp, layout_for
from maxtext_compat.paged.metadata import check_metadata

METADATA_NAMES = ("kv_lens", "page_indices", "cu_q_lens", "distribution")

# The kernel options' value rules (the dispatcher and this check share them).
Window = Annotated[
    int,
    Rule("an int >= 1 (the window in tokens)", lambda x: x >= 1,
         "pass {name}=None for full attention, or the window size in tokens (>= 1)"),
]  # fmt: skip
SoftCap = Annotated[
    float,
    Rule("a finite, non-zero number (soft_cap 0 divides by zero)", lambda x: math.isfinite(x) and x != 0,
         "pass {name}=None for no logit capping, or the cap value (e.g. 50.0)"),
]  # fmt: skip
Scale = Annotated[
    float,
    Rule("a finite number (a NaN or infinite scale makes every output row NaN)", lambda x: math.isfinite(x),
         "pass {name} as a finite float: 1.0 when the scale is folded into q (MaxText does), else head_dim ** -0.5"),
]  # fmt: skip


def is_concrete(x: Any) -> bool:
    import jax

    return not isinstance(x, jax.core.Tracer)


@checked
def check_kernel_inputs(
    q: Array,
    k: Array,
    v: Array,
    kv_cache: Array,
    kv_lens: Array,
    page_indices: Array,
    cu_q_lens: Array,
    distribution: Array,
    *,
    tp: PositiveInt = 1,
    hd64_kernel: bool = True,
    sliding_window: Window | None = None,
    soft_cap: SoftCap | None = None,
    attention_sink: Array | None = None,
    host_values: tuple[Any, Any, Any, Any] | None = None,
) -> KVCacheLayout:
    """Raise a typed error naming the bad argument; returns the cache layout the kernel will expect.

    host_values: the four metadata arrays as host sequences when the caller has them (saves a
    device-to-host copy per call); otherwise concrete arrays are fetched and tracers skipped.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(getattr(x, "shape", ())) != 3:
            raise InvalidArgumentError(
                "q/k/v are ragged token rows",
                argument=name,
                expected="a 3-D array [tokens, heads, head_dim]",
                found=f"shape {tuple(getattr(x, 'shape', ()))}",
                fix=f"reshape {name} to [tokens, heads, head_dim], e.g. {name}.reshape(tokens, -1, head_dim)",
            )
    if tuple(k.shape) != tuple(v.shape):
        raise InvalidArgumentError(
            "k and v must have one shape",
            argument="v",
            expected=tuple(k.shape),
            found=tuple(v.shape),
            fix="pass v with the same [tokens, KV heads, head_dim] shape as k (one value row per key row)",
        )
    if q.shape[0] != k.shape[0]:
        raise InvalidArgumentError(
            "q and k/v must have the same number of token rows",
            argument="k",
            expected=f"{q.shape[0]} rows",
            found=f"{k.shape[0]} rows",
            fix="pass k and v with one row per q row (the step's tokens, padded to max_num_tokens like q)",
        )
    if q.shape[2] != k.shape[2]:
        raise InvalidArgumentError(
            "q and k/v must have the same head_dim",
            argument="k",
            expected=q.shape[2],
            found=k.shape[2],
            fix=f"pass k and v with head_dim {q.shape[2]} (q's); the kernel has no separate value head_dim",
        )
    num_q_heads, num_kv_heads, head_dim = int(q.shape[1]), int(k.shape[1]), int(q.shape[2])
    if num_q_heads % num_kv_heads:
        raise InvalidArgumentError(
            "query heads must be a multiple of KV heads (GQA/MQA)",
            argument="q",
            expected=f"a multiple of {num_kv_heads} heads",
            found=num_q_heads,
            fix=f"pass q with a multiple of {num_kv_heads} heads (the model's num_query_heads), "
            "or k/v with a number of KV heads that divides q's",
        )
    if num_q_heads % tp:
        raise InvalidArgumentError(
            "query heads cannot be split over the model axis",
            argument="q",
            expected=f"a multiple of tp={tp} heads",
            found=num_q_heads,
            fix="pick a tensor-parallel degree that divides the query heads",
        )
    kv_heads_for_tp(num_kv_heads, tp)
    dtypes = {n: dtype_name(x.dtype) for n, x in (("q", q), ("k", k), ("v", v), ("kv_cache", kv_cache))}
    if len(set(dtypes.values())) != 1:
        raise InvalidArgumentError(
            "q, k, v and the KV cache must share one dtype (the kernel does no casting)",
            argument="kv_cache" if dtypes["q"] == dtypes["k"] == dtypes["v"] else "q/k/v",
            expected=f"all {dtypes['kv_cache']}",
            found=dtypes,
            fix="cast q/k/v to the cache dtype (MaxText >= 0.2.4 casts them to the layer dtype)",
        )
    layout = layout_for(
        kv_cache_shape=tuple(kv_cache.shape),
        kv_cache_dtype=kv_cache.dtype,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        tp=tp,
        hd64_kernel=hd64_kernel,
    )
    layout.check_cache(kv_cache)
    arrays = dict(zip(METADATA_NAMES, (kv_lens, page_indices, cu_q_lens, distribution), strict=True))
    for name, x in arrays.items():
        if dtype_name(x.dtype) != "int32":
            raise InvalidArgumentError(
                "metadata arrays must be int32",
                argument=name,
                expected="int32",
                found=dtype_name(x.dtype),
                fix=f"{name}.astype(jnp.int32)",
            )
        if len(x.shape) != 1:
            raise InvalidArgumentError(
                "metadata arrays are 1-D",
                argument=name,
                expected="1-D",
                found=f"shape {tuple(x.shape)}",
                fix=f"flatten {name}: {name}.reshape(-1)"
                + (" (the [max_num_seqs, pages_per_seq] block table, row-major)" if name == "page_indices" else ""),
            )
    max_num_seqs = int(kv_lens.shape[0])
    expected_len = {"cu_q_lens": max_num_seqs + 1, "distribution": 3}
    for name, want in expected_len.items():
        if arrays[name].shape[0] != want:
            raise InvalidArgumentError(
                "metadata array has the wrong length",
                argument=name,
                expected=f"length {want}" + (" (len(kv_lens) + 1)" if name == "cu_q_lens" else ""),
                found=f"length {arrays[name].shape[0]}",
                fix=(
                    f"pass cu_q_lens with len(kv_lens) + 1 = {want} entries (cumulative query lengths from 0)"
                    if name == "cu_q_lens"
                    else "pass distribution as 3 int32 values (decode end, prefill-only end, total sequences)"
                )
                + ", or build the metadata with maxtext_compat.paged.build_metadata",
            )
    if page_indices.shape[0] == 0 or page_indices.shape[0] % max_num_seqs:
        raise InvalidArgumentError(
            "page_indices is the flattened [max_num_seqs, pages_per_seq] block table",
            argument="page_indices",
            expected=f"a non-zero multiple of len(kv_lens)={max_num_seqs}",
            found=f"length {page_indices.shape[0]}",
            fix="pass page_indices as the block table flattened to max_num_seqs * pages_per_seq entries "
            f"({max_num_seqs} rows, each padded to pages_per_seq entries, e.g. with page 0)",
        )
    if attention_sink is not None and tuple(attention_sink.shape) != (num_q_heads,):
        raise InvalidArgumentError(
            "attention_sink holds one logit per query head",
            argument="attention_sink",
            expected=f"shape ({num_q_heads},)",
            found=tuple(attention_sink.shape),
            fix=f"pass attention_sink with one float per query head, shape ({num_q_heads},), or None for no sink",
        )
    if host_values is not None:
        values = dict(zip(METADATA_NAMES, host_values, strict=True))
    elif all(is_concrete(x) for x in arrays.values()):
        import numpy as np

        values = {n: np.asarray(x).tolist() for n, x in arrays.items()}
    else:
        return layout  # traced: the values do not exist yet
    check_metadata(
        values["kv_lens"],
        values["page_indices"],
        values["cu_q_lens"],
        values["distribution"],
        num_pages=layout.num_pages,
        page_size=layout.page_size,
        max_num_tokens=int(q.shape[0]),
    )
    return layout
