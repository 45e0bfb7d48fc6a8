"""Issue-11 §2 findings at the metadata level: each silently lost or misplaced K/V before, each refused now.

Pure python (the unit environment); tests/compat/test_kv_write_findings_real.py repeats them through the
adapters and the kernel of the real environments.
"""

from __future__ import annotations

import pytest

from maxtext_compat import paged
from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError, StaleSliceError
from maxtext_compat.paged import PageAllocator, SequenceSlice, build_metadata, check_metadata

LAYOUT = paged.KVCacheLayout(8, 16, 2, 128, "float32")
GEOM = {"num_pages": 8, "page_size": 16, "max_num_tokens": 32}


def _build(seqs):
    return build_metadata(seqs, LAYOUT, max_num_tokens=32, max_num_seqs=4, pages_per_seq=2)


def test_a_page_listed_twice_in_one_row_is_refused():
    """Found: passed every check; positions 0-15 and 16-31 of the request landed in one page (tokens lost)."""
    with pytest.raises(InvalidArgumentError, match="lists one page twice"):
        check_metadata([20, 0, 0, 0], [3, 3, 0, 0, 0, 0, 0, 0], [0, 20, 20, 20, 20], [0, 0, 1], **GEOM)
    with pytest.raises(InvalidArgumentError, match="lists one page twice") as e:
        _build([SequenceSlice(20, 20, (3, 3), "a")])
    assert e.value.argument == "seqs[0] (request 'a').pages"


def test_a_distribution_counting_fewer_sequences_than_cu_q_lens_holds_is_refused():
    """Found: the last request's K/V was never written (the kernel stops at distribution[2])."""
    with pytest.raises(InvalidArgumentError, match="past num_seqs") as e:
        check_metadata([5, 3, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0], [0, 5, 8, 8, 8], [0, 0, 1], **GEOM)
    assert e.value.argument == "distribution"


def test_metadata_for_16_token_pages_on_an_8_token_cache_is_refused():
    """Found: 8-token pages under metadata built for 16 wrote other requests' tokens."""
    md = _build([SequenceSlice(20, 20, (0, 1), "a")])
    with pytest.raises(InvalidArgumentError, match="built for another cache"):
        md.check_cache(num_pages=16, page_size=8)
    # hand-built arrays: a 20-token request needs 3 pages of 8, its row has 2
    with pytest.raises(InvalidArgumentError, match="rebuild it for this cache"):
        check_metadata(md.kv_lens, md.page_indices, md.cu_q_lens, md.distribution, num_pages=16, page_size=8,
                       max_num_tokens=32)  # fmt: skip


def test_a_slice_used_after_free_is_refused():
    """Found: a SequenceSlice kept after PageAllocator.free() overwrote the page's new owner."""
    alloc = PageAllocator(8, 16)
    old = alloc.append("a", 5)
    md = _build([old])
    alloc.free("a")
    alloc.append("b", 5)  # b gets a's page
    with pytest.raises(StaleSliceError, match="'a' was freed") as e:
        _build([old])
    assert e.value.argument == "seqs[0] (request 'a')"
    with pytest.raises(StaleSliceError):
        md.check_current()


def test_a_slice_of_an_earlier_step_is_refused():
    alloc = PageAllocator(8, 16)
    first = alloc.append("a", 5)
    alloc.append("a", 1)
    with pytest.raises(StaleSliceError, match="appended to again"):
        _build([first])


def test_negative_positions_are_refused():
    """Found: negative positions rotated K for the wrong positions (RoPE) with no error."""
    with pytest.raises(InvalidArgumentError, match="position differs") as e:
        check_metadata([3, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0], [0, 3, 3, 3, 3], [0, 0, 1], **GEOM,
                       input_positions=[-1, 0, 1])  # fmt: skip
    assert e.value.argument == "input_positions[0]" and "-1" in str(e.value)


@pytest.mark.parametrize("where", ["slice", "arrays"])
def test_a_float_page_id_is_refused_not_truncated(where):
    """Found: page id 1.7 became page 1 through the int32 cast."""
    with pytest.raises(InvalidArgumentTypeError, match="would be truncated"):
        if where == "slice":
            _build([SequenceSlice(5, 5, (1.7,), "a")])
        else:
            check_metadata([5, 0, 0, 0], [1.7, 0, 0, 0, 0, 0, 0, 0], [0, 5, 5, 5, 5], [0, 0, 1], **GEOM)


def test_a_hand_made_slice_is_not_lease_checked_but_its_pages_are():
    md = _build([SequenceSlice(5, 5, (2,), "a")])
    md.check_current()  # nothing to check: no allocator handed it out
    assert md.page_indices[0] == 2
