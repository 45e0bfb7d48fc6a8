"""Paged KV cache bookkeeping without numpy or jax: layout arithmetic, page allocator, metadata and its checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.paged import (
    KVCacheLayout,
    PageAllocator,
    SequenceSlice,
    build_metadata,
    check_metadata,
    kv_heads_for_tp,
)

# -- layout ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "head_dim", "dtype", "tp", "shape"),
    [
        (2, 128, "float32", 1, (8, 16, 4, 1, 128)),  # K/V interleaved: 2 heads -> 4 rows
        (2, 128, "bfloat16", 1, (8, 16, 2, 2, 128)),  # packing 2
        (1, 128, "bfloat16", 1, (8, 16, 1, 2, 128)),
        (3, 96, "float32", 1, (8, 16, 6, 1, 128)),  # head_dim padded to 128 lanes
        (2, 256, "float32", 1, (8, 16, 4, 1, 256)),
        (2, 64, "float32", 1, (8, 16, 2, 1, 128)),  # hd64: K||V in 128 lanes, one row per head
        (3, 64, "bfloat16", 1, (8, 16, 2, 2, 128)),  # hd64: align(3, 2) // 2
        (2, 128, "float32", 2, (8, 16, 4, 1, 128)),  # split heads
        (1, 128, "float32", 4, (8, 16, 8, 1, 128)),  # MQA repeated to 4 heads
        (2, 64, "bfloat16", 2, (8, 16, 2, 2, 128)),  # per shard align(1, 2) // 2 = 1, x2 shards
        (2, 128, "float8_e4m3fn", 2, (8, 16, 2, 4, 128)),  # per shard align(2, 4) // 4 = 1, x2
    ],
)
def test_layout_shape(heads, head_dim, dtype, tp, shape):
    lay = KVCacheLayout(8, 16, heads, head_dim, dtype, tp=tp)
    assert lay.shape == shape
    assert lay.nbytes == 8 * 16 * shape[2] * shape[3] * shape[4] * lay.bits // 8
    assert lay.shard_shape[2] * tp == shape[2]


def test_layout_knows_kernel_packing_and_replication():
    lay = KVCacheLayout(4, 16, 1, 64, "bfloat16", tp=4)
    assert (lay.kernel, lay.packing, lay.cache_kv_heads, lay.replication, lay.lanes) == ("hd64", 2, 4, 4, 128)
    assert KVCacheLayout(4, 16, 2, 64, hd64=False).kernel == "v3"
    assert KVCacheLayout(4, 16, 2, 128).capacity_tokens == 64


def test_layout_slots_follow_merge_kv():
    lay = KVCacheLayout(4, 16, 2, 128, "float32")
    assert lay.slots(1, "k") == [(2, 0)] and lay.slots(1, "v") == [(3, 0)]
    hd64 = KVCacheLayout(4, 16, 2, 64, "float32")
    assert hd64.slots(1, "v") == [(1, 64)]
    rep = KVCacheLayout(4, 16, 1, 128, "float32", tp=2)  # two shards, each one copy of head 0
    assert rep.slots(0, "k") == [(0, 0), (2, 0)]


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"page_size": 3, "dtype": "bfloat16"}, InvalidArgumentError, "page_size"),
        ({"dtype": "int8"}, InvalidArgumentError, "dtype"),
        ({"tp": 3}, InvalidArgumentError, "tp"),  # 2 heads over 3 shards
        ({"num_pages": 0}, InvalidArgumentError, "num_pages"),
        ({"num_pages": 2.0}, InvalidArgumentTypeError, "num_pages"),
        ({"hd64": True}, InvalidArgumentError, "hd64"),  # head_dim is 128
    ],
)
def test_layout_rejects_bad_geometry(kwargs, error, argument):
    base = {"num_pages": 4, "page_size": 16, "num_kv_heads": 2, "head_dim": 128, "dtype": "float32"}
    with pytest.raises(error) as info:
        KVCacheLayout(**{**base, **kwargs})
    assert info.value.argument == argument
    assert info.value.fix or info.value.expected


def test_page_size_error_names_the_fix():
    with pytest.raises(InvalidArgumentError, match=r"page_size=8"):
        KVCacheLayout(4, 7, 2, 128, "float8_e5m2")


def test_kv_heads_for_tp_matches_tpu_inference_rule():
    assert [kv_heads_for_tp(2, tp) for tp in (1, 2, 4, 8)] == [2, 2, 4, 8]
    with pytest.raises(InvalidArgumentError):
        kv_heads_for_tp(4, 3)
    with pytest.raises(InvalidArgumentError):
        kv_heads_for_tp(3, 4)


# -- allocator -------------------------------------------------------------------------------------


def test_allocator_grows_requests_page_by_page():
    a = PageAllocator(6, 4)
    first = a.append("r", 5)  # prefill 5 tokens -> 2 pages
    assert (first.q_len, first.kv_len, len(first.pages), first.context_len) == (5, 5, 2, 0)
    for _ in range(3):
        step = a.append("r", 1)
    assert step.kv_len == 8 and step.pages == first.pages  # 8 tokens still fit 2 pages
    assert a.append("r", 1).pages[:2] == first.pages and a.num_free == 3
    a.free("r")
    assert a.num_free == 6 and a.requests() == []


def test_allocator_shuffles_and_reserves():
    a = PageAllocator(16, 4, seed=3, reserved=[0])
    pages = a.allocate("x", 64 - 4)
    assert 0 not in pages and sorted(pages) == list(range(1, 16)) and list(pages) != sorted(pages)


def test_allocator_out_of_pages_is_typed():
    a = PageAllocator(2, 4)
    a.append("a", 4)
    with pytest.raises(CacheCapacityError) as info:
        a.append("b", 5)  # needs 2 pages, 1 free
    assert "free" in str(info.value) and info.value.fix
    assert a.requests() == ["a"]  # the failed request holds nothing


def test_block_table_pads_and_checks_width():
    a = PageAllocator(8, 4)
    a.append("a", 9)
    a.append("b", 1)
    assert a.block_table(["a", "b"], 4, pad=0) == [[0, 1, 2, 0], [3, 0, 0, 0]]
    with pytest.raises(CacheCapacityError):
        a.block_table(["a"], 2)
    with pytest.raises(InvalidArgumentError):
        a.pages("nope")


# -- metadata --------------------------------------------------------------------------------------

LAYOUT = KVCacheLayout(num_pages=16, page_size=4, num_kv_heads=2, head_dim=128)


def _mixed() -> tuple[PageAllocator, list[SequenceSlice]]:
    a = PageAllocator(16, 4, seed=0)
    a.append("p0", 3)
    a.append("d", 6)
    return a, [a.append("prefill", 5), a.append("d", 1), a.append("p0", 2)]


def test_build_metadata_orders_decode_first():
    _, seqs = _mixed()
    md = build_metadata(seqs, LAYOUT, max_num_tokens=16, max_num_seqs=4, pages_per_seq=4)
    assert md.request_order == (1, 0, 2)
    assert md.request_ids == ("d", "prefill", "p0")
    assert md.distribution == (1, 1, 3)
    assert md.cu_q_lens == (0, 1, 6, 8, 8)
    assert md.kv_lens == (7, 5, 5, 0)
    assert md.input_positions[:8] == (6, 0, 1, 2, 3, 4, 3, 4)
    # caller tokens: prefill 0..4, d 5, p0 6..7
    assert md.token_order == (5, 0, 1, 2, 3, 4, 6, 7)
    assert md.pages_of(0) == seqs[1].pages
    assert (md.num_seqs, md.num_tokens, md.max_num_tokens, md.pages_per_seq) == (3, 8, 16, 4)
    assert md.q_lens() == [1, 5, 2]


def test_build_metadata_pads_to_powers_of_two_by_default():
    _, seqs = _mixed()
    md = build_metadata(seqs, LAYOUT)
    assert (md.max_num_tokens, md.max_num_seqs, md.pages_per_seq) == (8, 4, 2)


def test_build_metadata_decode_only_and_prefill_only():
    a = PageAllocator(16, 4)
    pre = [a.append(i, n) for i, n in enumerate((4, 8, 1))]
    md = build_metadata(pre[:2], LAYOUT)
    assert md.distribution == (0, 0, 2)
    dec = [a.append(i, 1) for i in range(3)]
    md = build_metadata(dec, LAYOUT)
    assert md.distribution == (3, 3, 3) and md.request_order == (0, 1, 2)


@pytest.mark.parametrize(
    ("seq", "error", "argument"),
    [
        (SequenceSlice(0, 4, (0,)), InvalidArgumentError, "seqs[0].q_len"),
        (SequenceSlice(5, 4, (0,)), InvalidArgumentError, "seqs[0].kv_len"),
        (SequenceSlice(1, 9, (0, 1)), CacheCapacityError, "seqs[0].pages"),
        (SequenceSlice(1, 4, (16,)), InvalidArgumentError, "seqs[0].pages"),
        (SequenceSlice(1, 65, tuple(range(16))), CacheCapacityError, "seqs[0].kv_len"),
    ],
)
def test_build_metadata_rejects_bad_sequences(seq, error, argument):
    with pytest.raises(error) as info:
        build_metadata([seq], LAYOUT)
    assert info.value.argument == argument


def test_build_metadata_rejects_overflowing_batches():
    seqs = [SequenceSlice(5, 5, (0, 1)), SequenceSlice(5, 5, (2, 3))]
    with pytest.raises(CacheCapacityError, match="max_num_tokens"):
        build_metadata(seqs, LAYOUT, max_num_tokens=8)
    with pytest.raises(CacheCapacityError, match="max_num_seqs"):
        build_metadata(seqs, LAYOUT, max_num_seqs=1)
    with pytest.raises(CacheCapacityError, match="pages_per_seq"):
        build_metadata(seqs, LAYOUT, pages_per_seq=1)
    with pytest.raises(InvalidArgumentError):
        build_metadata([], LAYOUT)


def test_build_metadata_rejects_two_writers_on_one_page():
    seqs = [SequenceSlice(2, 2, (5,)), SequenceSlice(1, 3, (5,))]
    with pytest.raises(InvalidArgumentError, match="same page"):
        build_metadata(seqs, LAYOUT)


def test_shared_full_prefix_pages_are_allowed():
    # both requests read the full page 5 (a cached prefix) and write their own second page
    seqs = [SequenceSlice(2, 6, (5, 6)), SequenceSlice(1, 5, (5, 7))]
    md = build_metadata(seqs, LAYOUT)
    assert md.distribution == (1, 1, 2)


# -- check_metadata on raw arrays ------------------------------------------------------------------

# seq 0 decodes its 5th token (pages 0, 1), seq 1 prefills 3 tokens (page 2); 3 slots, 2 pages per row
GOOD = {"kv_lens": [5, 3, 0], "page_indices": [0, 1, 2, 0, 0, 0], "cu_q_lens": [0, 1, 4, 4], "distribution": [1, 1, 2]}


def _check(**overrides):
    args = {**GOOD, **overrides}
    check_metadata(
        args["kv_lens"],
        args["page_indices"],
        args["cu_q_lens"],
        args["distribution"],
        num_pages=4,
        page_size=4,
        max_num_tokens=8,
    )


def test_check_metadata_accepts_good_batch():
    _check()


@pytest.mark.parametrize(
    ("overrides", "argument", "error"),
    [
        ({"cu_q_lens": [0, 1, 4]}, "cu_q_lens", InvalidArgumentError),
        ({"distribution": [1, 1]}, "distribution", InvalidArgumentError),
        ({"page_indices": [0, 1, 2, 0, 0]}, "page_indices", InvalidArgumentError),
        ({"distribution": [1, 2, 2]}, "distribution", InvalidArgumentError),  # prefill-only segment
        ({"distribution": [2, 2, 1]}, "distribution", InvalidArgumentError),
        ({"distribution": [1, 1, 4]}, "distribution", InvalidArgumentError),  # more than max_num_seqs
        ({"cu_q_lens": [1, 1, 4, 4]}, "cu_q_lens[0]", InvalidArgumentError),
        ({"cu_q_lens": [0, 1, 9, 9]}, "cu_q_lens", CacheCapacityError),  # 9 tokens > 8 rows
        ({"cu_q_lens": [0, 1, 1, 1]}, "cu_q_lens[1:3]", InvalidArgumentError),  # q_len 0
        ({"kv_lens": [5, 2, 0]}, "kv_lens[1]", InvalidArgumentError),  # q_len 3 > kv_len 2
        ({"distribution": [2, 2, 2]}, "cu_q_lens[1:3]", InvalidArgumentError),  # decode with q_len 3
        ({"kv_lens": [13, 3, 0]}, "kv_lens[0]", CacheCapacityError),  # 4 pages > 3 per seq
        ({"page_indices": [0, 4, 2, 0, 0, 0]}, "page_indices[1]", InvalidArgumentError),  # page 4 of 4
        ({"page_indices": [0, 1, 1, 0, 0, 0]}, "page_indices[2]", InvalidArgumentError),  # page 1 written twice
    ],
)
def test_check_metadata_rejects(overrides, argument, error):
    with pytest.raises(error) as info:
        _check(**overrides)
    assert info.value.argument == argument
    assert info.value.expected is not None


def test_paged_and_rpa_import_without_numpy_or_jax():
    code = (
        "import sys, maxtext_compat.paged, maxtext_compat.kernel.rpa, maxtext_compat.paged.checks\n"
        "print(sorted(m for m in ('numpy', 'jax', 'tpu_inference', 'vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
