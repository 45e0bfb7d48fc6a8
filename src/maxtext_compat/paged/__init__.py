"""Paged KV cache for tpu-inference's ragged paged attention: layout, pages, metadata, read-back.

Imports nothing heavy: numpy/jax load only when an array is made or read.
"""

from __future__ import annotations

from maxtext_compat.paged.allocator import PageAllocator, SequenceSlice
from maxtext_compat.paged.checks import check_kernel_inputs
from maxtext_compat.paged.layout import KVCacheLayout, kv_heads_for_tp, layout_for
from maxtext_compat.paged.metadata import RaggedMetadata, build_metadata, check_metadata, check_sequences
from maxtext_compat.paged.readback import read_kv, read_kv_replicas, read_sequence, write_kv
from maxtext_compat.paged.sharding import head_parallelism, kv_cache_sharding, make_mesh, qkv_sharding

__all__ = [
    "KVCacheLayout",
    "PageAllocator",
    "RaggedMetadata",
    "SequenceSlice",
    "build_metadata",
    "check_kernel_inputs",
    "check_metadata",
    "check_sequences",
    "head_parallelism",
    "kv_cache_sharding",
    "kv_heads_for_tp",
    "layout_for",
    "make_mesh",
    "qkv_sharding",
    "read_kv",
    "read_kv_replicas",
    "read_sequence",
    "write_kv",
]
