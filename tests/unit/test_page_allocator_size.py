"""PageAllocator's size: a cache the kernel cannot address is refused at once, one it can is set up at once.

Issue 39: `PageAllocator(2**40, 16)` listed 2**40 free pages (a raw MemoryError after seconds, or the machine's
memory). Now num_pages * page_size is held to int32 (a request that fills the cache has that many tokens, and the
kernel's metadata is int32), and the unshuffled free list is lazy. Memory is measured (tracemalloc), not time: what
was built is what took the seconds. The lazy list must hand out exactly what the listed one did.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError
from maxtext_compat.paged import PageAllocator
from maxtext_compat.paged.allocator import MAX_CACHE_TOKENS

pytestmark = pytest.mark.envs("unit")

SMALL = 64 * 1024  # bytes: a handful of objects, never a list of pages


def _peak(make: Callable[[], Any]) -> tuple[Any, int]:
    """(what make returned or raised, the peak bytes it allocated)."""
    PageAllocator(4, 4)  # the contract compiles its checker at the first call: not what is measured
    tracemalloc.start()
    try:
        try:
            out = make()
        except InvalidArgumentError as err:
            out = err
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_cache_past_int32_is_refused_at_once_naming_the_limit():
    err, peak = _peak(lambda: PageAllocator(2**40, 16))
    assert isinstance(err, InvalidArgumentError) and peak < SMALL
    assert err.argument == "num_pages"
    assert "2**31 - 1" in err.expected and "int32" in err.expected
    assert "17,592,186,044,416 tokens" in err.found
    assert "at most 134,217,727 pages of 16 tokens" in err.fix


def test_the_limit_is_on_token_slots_and_names_the_culprit():
    assert PageAllocator(MAX_CACHE_TOKENS // 16, 16).num_free == MAX_CACHE_TOKENS // 16
    with pytest.raises(InvalidArgumentError) as over:
        PageAllocator(MAX_CACHE_TOKENS // 16 + 1, 16)
    assert over.value.argument == "num_pages"
    with pytest.raises(InvalidArgumentError) as page:
        PageAllocator(1, 2**31)
    assert page.value.argument == "page_size"


def test_the_largest_cache_is_set_up_without_listing_its_pages():
    alloc, peak = _peak(lambda: PageAllocator(MAX_CACHE_TOKENS, 1, reserved=[1]))
    assert peak < SMALL
    assert alloc.num_free == MAX_CACHE_TOKENS - 1
    assert alloc.allocate("a", 3) == (0, 2, 3)  # in order, the reserved page skipped
    alloc.free("a")
    assert alloc.allocate("b", 4) == (0, 2, 3, 4)  # the freed pages first, then the next never handed out
    with pytest.raises(CacheCapacityError):
        alloc.allocate("c", MAX_CACHE_TOKENS)


class Listed:
    """The free list as it was: every free page listed up front, handed out from the end."""

    def __init__(self, num_pages: int, reserved: set[int]) -> None:
        self.free = [p for p in range(num_pages) if p not in reserved][::-1]
        self.pages: dict[str, list[int]] = {}


OPS = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 4)), max_size=40)  # (request, pages to add; 0: free)


@settings(max_examples=200, deadline=None)
@given(num_pages=st.integers(1, 12), reserved=st.sets(st.integers(0, 11), max_size=4), ops=OPS)
def test_the_lazy_free_list_hands_out_what_the_listed_one_did(num_pages, reserved, ops):
    reserved = {p for p in reserved if p < num_pages}
    alloc, listed = PageAllocator(num_pages, 1, reserved=reserved), Listed(num_pages, reserved)
    for rid, more in ops:
        if more == 0:
            if rid in listed.pages:
                alloc.free(rid)
                listed.free.extend(reversed(listed.pages.pop(rid)))
            continue
        held = listed.pages.get(rid, [])
        if more > len(listed.free):
            with pytest.raises(CacheCapacityError):
                alloc.allocate(rid, len(held) + more)
            continue
        listed.pages[rid] = held + [listed.free.pop() for _ in range(more)]
        assert list(alloc.allocate(rid, len(held) + more)) == listed.pages[rid]
        assert alloc.num_free == len(listed.free)
