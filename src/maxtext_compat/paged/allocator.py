"""A page allocator and block tables for a batch of requests sharing one paged KV cache.

Why: vLLM owns page allocation when it serves a model, but tests, benchmarks and anyone
driving the kernel directly need the same bookkeeping: which physical pages hold a request's
tokens (in order), how many tokens it has, and what it adds this step. Pages are handed out
from a free list that can be shuffled, so tests exercise non-contiguous block tables.

Pure python: the unit environment (no numpy/jax) tests it.
"""

from __future__ import annotations

import itertools
import random
import weakref
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, StaleSliceError
from maxtext_compat.paged.layout import cdiv


class Lease:
    """A request's hold on its pages for one step, valid until the request is freed or appended to again.

    Why: a slice (or metadata built from it) kept past `free()` names pages that may already belong to
    another request; writing with it would overwrite that request's tokens without an error.
    """

    __slots__ = ("_allocator", "generation", "request_id")

    def __init__(self, allocator: PageAllocator, request_id: Hashable, generation: int) -> None:
        self._allocator = weakref.ref(allocator)
        self.request_id = request_id
        self.generation = generation

    @property
    def current(self) -> bool:
        """Still the request's latest slice (an allocator that no longer exists hands no page to anyone)."""
        allocator = self._allocator()
        return allocator is None or allocator._generation.get(self.request_id) == self.generation

    def check(self, where: str) -> None:
        """StaleSliceError naming `where` unless the lease is current."""
        if self.current:
            return
        now = self._allocator()._generation.get(self.request_id)  # type: ignore[union-attr]
        what = "was freed" if now is None else "was appended to again (a newer step was cut for it)"
        raise StaleSliceError(
            f"request {self.request_id!r} {what} after this slice was cut: its pages may belong to another request now",
            argument=where,
            expected="a slice from the request's latest PageAllocator.append",
            found=f"a slice of step {self.generation} of request {self.request_id!r}",
            fix="cut a new slice with PageAllocator.append for every step, and build metadata from it before "
            "freeing or appending to the request again",
        )


@dataclass(frozen=True)
class SequenceSlice:
    """One request's part of a step: q_len new tokens that end at kv_len, stored in `pages`.

    The new tokens sit at positions [kv_len - q_len, kv_len); `pages[i]` holds positions
    [i * page_size, (i + 1) * page_size).
    """

    q_len: int
    kv_len: int
    pages: tuple[int, ...]
    request_id: Hashable | None = None
    lease: Lease | None = field(default=None, compare=False, repr=False)  # set by PageAllocator.append

    @property
    def context_len(self) -> int:
        """Tokens already in the cache before this step."""
        return self.kv_len - self.q_len

    @property
    def is_decode(self) -> bool:
        return self.q_len == 1

    def check_current(self, where: str = "seq") -> None:
        """StaleSliceError when the allocator freed the request or cut a newer step since (hand-made: no check)."""
        if self.lease is not None:
            self.lease.check(where)


class PageAllocator:
    """Hands out pages of one cache to requests and remembers each request's token count."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        *,
        seed: int | None = None,
        reserved: Iterable[int] = (),
    ) -> None:
        """seed: shuffle the free list (None keeps pages in order); reserved: never handed out."""
        if num_pages < 1 or page_size < 1:
            raise InvalidArgumentError(
                "the cache needs at least one page of at least one token",
                argument="num_pages/page_size",
                expected="num_pages >= 1 and page_size >= 1",
                found=f"num_pages={num_pages}, page_size={page_size}",
                fix="pass the num_pages and page_size of the cache's KVCacheLayout (both >= 1), "
                "e.g. PageAllocator(layout.num_pages, layout.page_size)",
            )
        keep = set(reserved)
        bad = sorted(p for p in keep if not 0 <= p < num_pages)
        if bad:
            raise InvalidArgumentError(
                "reserved pages out of range",
                argument="reserved",
                expected=f"page ids in [0, {num_pages})",
                found=bad,
                fix=f"reserve only page ids of this cache (0 to {num_pages - 1}), or drop {bad}",
            )
        free = [p for p in range(num_pages) if p not in keep]
        if seed is not None:
            random.Random(seed).shuffle(free)
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: list[int] = free[::-1]  # pop() from the end hands out free[0] first
        self._pages: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._generation: dict[Hashable, int] = {}  # the step of each live request's latest slice
        self._steps = itertools.count(1)

    # -- queries --------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    def requests(self) -> list[Hashable]:
        return list(self._pages)

    def pages(self, request_id: Hashable) -> tuple[int, ...]:
        return tuple(self._pages[self._known(request_id)])

    def num_tokens(self, request_id: Hashable) -> int:
        return self._tokens.get(request_id, 0)

    # -- changes --------------------------------------------------------------------------------

    def allocate(self, request_id: Hashable, num_tokens: int) -> tuple[int, ...]:
        """Make sure `request_id` has pages for `num_tokens` tokens in total; returns its pages."""
        if num_tokens < 0:
            raise InvalidArgumentError(
                "token count must be >= 0",
                argument="num_tokens",
                expected=">= 0",
                found=num_tokens,
                fix="pass the request's total token count (cached tokens + new tokens), 0 or more",
            )
        pages = self._pages.setdefault(request_id, [])
        need = cdiv(num_tokens, self.page_size) - len(pages)
        if need > len(self._free):
            if not pages:
                del self._pages[request_id]
            raise CacheCapacityError(
                "the KV cache has too few free pages for this request",
                argument="num_tokens",
                expected=f"at most {(len(pages) + len(self._free)) * self.page_size} tokens for request {request_id!r}",
                found=f"{num_tokens} tokens ({need} more pages of {self.page_size}, {len(self._free)} free)",
                fix="free finished requests (PageAllocator.free) or allocate a cache with more pages",
            )
        for _ in range(max(0, need)):
            pages.append(self._free.pop())
        return tuple(pages)

    def append(self, request_id: Hashable, q_len: int) -> SequenceSlice:
        """Add q_len new tokens to a request (prefill or decode); returns its slice of the step."""
        if q_len < 1:
            raise InvalidArgumentError(
                "a request in a step adds at least one token",
                argument="q_len",
                expected=">= 1",
                found=q_len,
                fix="pass q_len >= 1 (the new tokens of this step), or leave the request out of the step",
            )
        kv_len = self.num_tokens(request_id) + q_len
        pages = self.allocate(request_id, kv_len)
        self._tokens[request_id] = kv_len
        generation = self._generation[request_id] = next(self._steps)
        return SequenceSlice(q_len, kv_len, pages, request_id, Lease(self, request_id, generation))

    def free(self, request_id: Hashable) -> None:
        pages = self._pages.pop(self._known(request_id))
        self._tokens.pop(request_id, None)
        self._generation.pop(request_id, None)
        self._free.extend(reversed(pages))

    def block_table(self, request_ids: Sequence[Hashable], pages_per_seq: int, *, pad: int = 0) -> list[list[int]]:
        """One row of `pages_per_seq` page ids per request (padded with `pad`, never read by the kernel)."""
        rows = []
        for rid in request_ids:
            pages = self.pages(rid)
            if len(pages) > pages_per_seq:
                raise CacheCapacityError(
                    "a request holds more pages than a block-table row has room for",
                    argument="pages_per_seq",
                    expected=f">= {len(pages)} for request {rid!r}",
                    found=pages_per_seq,
                    fix="raise pages_per_seq (max model length / page_size)",
                )
            rows.append([*pages, *([pad] * (pages_per_seq - len(pages)))])
        return rows

    def _known(self, request_id: Hashable) -> Hashable:
        if request_id not in self._pages:
            raise InvalidArgumentError(
                "unknown request",
                argument="request_id",
                expected=f"one of {list(self._pages)}",
                found=repr(request_id),
                fix="allocate (or append to) the request first",
            )
        return request_id
