"""Greedy generation through the paged-KV call of any MaxText release, and its dense reference.

    from maxtext_compat.engine import PagedEngine, dense_greedy, compare, format_table
    paged = PagedEngine(model).generate(prompts, num_steps=8)     # ragged prefill + 8 decode steps
    dense = dense_greedy(dense_model, prompts, num_steps=8)       # old call, train mode, no cache
    print(format_table(compare(paged, dense)))

Not imported by `maxtext_compat`; jax/flax load when a run starts.
"""

from __future__ import annotations

from maxtext_compat.engine.compare import ComparisonRow, compare, format_table, max_logits_diff
from maxtext_compat.engine.dense import check_dense_model, dense_greedy
from maxtext_compat.engine.paged import PagedEngine, cache_mesh_for, default_buckets, layout_for_model
from maxtext_compat.engine.types import Buckets, Generation, StepRecord

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
    "layout_for_model",
    "max_logits_diff",
]
