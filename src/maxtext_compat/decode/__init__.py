"""Greedy generation through the paged-KV call of any MaxText release, and its dense reference.

    from maxtext_compat.decode import PagedEngine, dense_greedy, compare, format_table
    paged = PagedEngine(model).generate(prompts, num_steps=8)     # ragged prefill + 8 decode steps
    dense = dense_greedy(dense_model, prompts, num_steps=8)       # old call, train mode, no cache
    print(format_table(compare(paged, dense)))

Not imported by `maxtext_compat`; numpy, jax and flax load when a name is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from maxtext_compat._lazy import lazy_face

if TYPE_CHECKING:
    from maxtext_compat.decode.comparison import ComparisonRow, compare, format_table, max_logits_diff
    from maxtext_compat.decode.dense import check_dense_model, dense_greedy
    from maxtext_compat.decode.greedy import greedy_decode
    from maxtext_compat.decode.paged import PagedEngine, cache_mesh_for, default_buckets, layout_for_model
    from maxtext_compat.decode.types import Buckets, Generation, StepRecord

_EXPORTS = {
    "ComparisonRow": "comparison",
    "compare": "comparison",
    "format_table": "comparison",
    "max_logits_diff": "comparison",
    "check_dense_model": "dense",
    "dense_greedy": "dense",
    "greedy_decode": "greedy",
    "PagedEngine": "paged",
    "cache_mesh_for": "paged",
    "default_buckets": "paged",
    "layout_for_model": "paged",
    "Buckets": "types",
    "Generation": "types",
    "StepRecord": "types",
}
__all__ = [
    "Buckets",
    "ComparisonRow",
    "Generation",
    "PagedEngine",
    "StepRecord",
    "cache_mesh_for",
    "check_dense_model",
    "compare",
    "default_buckets",
    "dense_greedy",
    "format_table",
    "greedy_decode",
    "layout_for_model",
    "max_logits_diff",
]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
