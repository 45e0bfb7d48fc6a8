"""A page allocator and block tables for a batch of requests sharing one paged KV cache.

Why: vLLM owns page allocation when it serves a model, but tests, benchmarks and anyone
driving the kernel directly need the same bookkeeping: which physical pages hold a request's
tokens (in order), how many tokens it has, and what it adds this step. Pages are handed out
from a free list that can be shuffled, so tests exercise non-contiguous block tables.

Freed pages cannot be written through: every page id the allocator hands out is a `PageId` (an int that
remembers which allocation of which allocator it came from), so a slice built from pages that were freed and
handed to another request since is refused with StaleSliceError however it was built (by `append`, or by
hand from `allocate` / `pages` / `block_table`, sliced or copied into a list). Page ids written as literals
carry no such memory: they are the caller's own bookkeeping.

Pure python: the unit environment (no numpy/jax) tests it.
"""

from __future__ import annotations

import itertools
import random
import weakref
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from maxtext_compat.contract import IntSequence, NonNegativeInt, PositiveInt, checked, is_int
from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, InvalidArgumentTypeError, StaleSliceError
from maxtext_compat.paged.layout import cdiv

# The most token slots (num_pages * page_size) a cache may have: a request that fills the cache has that many
# tokens, and the kernel's metadata holds token counts and page ids as int32 (kv_lens, page_indices).
MAX_CACHE_TOKENS = 2**31 - 1

STALE_FIX = (
    "cut a new slice with PageAllocator.append for every step, and build metadata from it before freeing or "
    "appending to the request again"
)


class PageId(int):
    """A page id handed out by a PageAllocator: an int that knows the allocation it belongs to.

    Why an int: it is used wherever a page id is (metadata, numpy, block tables) and survives slicing and
    copying into lists, so the check below runs on any slice built from it. Pickled or deep-copied it is a
    plain int (the allocator is not carried along)."""

    _allocator: weakref.ref[PageAllocator]
    epoch: int
    request_id: Hashable

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return int, (int(self),)

    @property
    def current(self) -> bool:
        """Still held by the allocation that handed it out (a dead allocator hands no page to anyone)."""
        allocator = self._allocator()
        return allocator is None or allocator._epoch.get(int(self)) == self.epoch

    def check(self, where: str) -> None:
        """StaleSliceError naming `where` unless the page still belongs to the allocation it came from."""
        if self.current:
            return
        allocator = self._allocator()
        owner = allocator._owner.get(int(self)) if allocator is not None else None
        now = "is free" if owner is None else f"belongs to request {owner!r} now"
        raise StaleSliceError(
            f"page {int(self)} was handed to request {self.request_id!r}, which freed it; it {now}",
            argument=where,
            expected=f"pages that request {self.request_id!r} still holds (PageAllocator.pages)",
            found=f"page {int(self)}, freed after it was read",
            fix=STALE_FIX,
        )


def _page(allocator: PageAllocator, page: int, epoch: int, request_id: Hashable) -> PageId:
    p = PageId(page)
    p._allocator, p.epoch, p.request_id = weakref.ref(allocator), epoch, request_id
    return p


class PageLease:
    """The hold of a hand-made slice (built from pages an allocator handed out): every page still held.

    Same interface as Lease (`check(where)`, `request_id`), so metadata built from the slice is checked
    wherever an appended slice's is."""

    __slots__ = ("pages", "request_id")

    def __init__(self, pages: tuple[PageId, ...], request_id: Hashable | None) -> None:
        self.pages, self.request_id = pages, request_id

    def check(self, where: str) -> None:
        for page in self.pages:
            page.check(f"{where}.pages")
            if self.request_id is not None and page.request_id != self.request_id:
                raise InvalidArgumentError(
                    f"page {int(page)} belongs to request {page.request_id!r}, not to this slice's request",
                    argument=f"{where}.pages",
                    expected=f"pages of request {self.request_id!r} (PageAllocator.pages({self.request_id!r}))",
                    found=f"page {int(page)} of request {page.request_id!r}",
                    fix="build a request's slice from its own pages: writing into another request's pages "
                    "overwrites its tokens",
                )


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
            fix=STALE_FIX,
        )


@checked
@dataclass(frozen=True)
class SequenceSlice:
    """One request's part of a step: q_len new tokens that end at kv_len, stored in `pages`.

    The new tokens sit at positions [kv_len - q_len, kv_len); `pages[i]` holds positions
    [i * page_size, (i + 1) * page_size). Types are checked here; the values (q_len >= 1, kv_len >= q_len,
    enough pages, page ids of the cache) are checked against the layout and the step's other slices by
    build_metadata, whose errors name the slice's place in the step (seqs[i]).
    """

    q_len: int
    kv_len: int
    pages: IntSequence  # kept as a tuple
    request_id: Hashable | None = None
    # Set by PageAllocator.append; for a slice built by hand from an allocator's pages, a PageLease.
    lease: Lease | PageLease | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pages", tuple(self.pages))
        for name in ("q_len", "kv_len"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy integers become ints
        if self.lease is None:
            held = tuple(p for p in self.pages if isinstance(p, PageId))
            if held:
                object.__setattr__(self, "lease", PageLease(held, self.request_id))

    @property
    def context_len(self) -> int:
        """Tokens already in the cache before this step."""
        return self.kv_len - self.q_len

    @property
    def is_decode(self) -> bool:
        return self.q_len == 1

    def check_current(self, where: str = "seq") -> None:
        """StaleSliceError when the allocator freed the request or cut a newer step since, or (built by hand
        from an allocator's pages) when a page was freed since; pages written as literals are not checked."""
        if self.lease is not None:
            self.lease.check(where)


@checked
class PageAllocator:
    """Hands out pages of one cache to requests and remembers each request's token count."""

    def __init__(
        self,
        num_pages: PositiveInt,
        page_size: PositiveInt,
        *,
        seed: int | None = None,
        reserved: Iterable[int] = (),
    ) -> None:
        """seed: shuffle the free list (None keeps pages in order); reserved: never handed out.

        Unshuffled, the free list is lazy (pages never handed out are counted, not listed), so a cache of any
        size the kernel can address is set up at once; a seeded one is shuffled whole, here."""
        num_pages, page_size = int(num_pages), int(page_size)
        if num_pages * page_size > MAX_CACHE_TOKENS:
            big = "page_size" if page_size > MAX_CACHE_TOKENS else "num_pages"
            raise InvalidArgumentError(
                "no KV cache the kernel can address has this many token slots",
                argument=big,
                expected=f"num_pages * page_size <= 2**31 - 1 ({MAX_CACHE_TOKENS:,} tokens: a request that fills the "
                "cache holds that many, and the kernel's metadata holds token counts and page ids as int32)",
                found=f"num_pages={num_pages:,} * page_size={page_size:,} = {num_pages * page_size:,} tokens",
                fix=f"size the cache from its memory (KVCacheLayout.bytes_per_page): at most "
                f"{MAX_CACHE_TOKENS // page_size:,} pages of {page_size} tokens",
            )
        keep = set(reserved)
        odd = [p for p in keep if not is_int(p)]
        if odd:
            raise InvalidArgumentTypeError(
                "reserved page ids must be ints",
                argument="reserved",
                expected="page ids as ints (Python or numpy integers)",
                found=repr(sorted(odd, key=repr)),
                fix="pass reserved as ints, e.g. reserved=[0]; a float page id is never rounded",
            )
        keep = {int(p) for p in keep}
        bad = sorted(p for p in keep if not 0 <= p < num_pages)
        if bad:
            raise InvalidArgumentError(
                "reserved pages out of range",
                argument="reserved",
                expected=f"page ids in [0, {num_pages})",
                found=bad,
                fix=f"reserve only page ids of this cache (0 to {num_pages - 1}), or drop {bad}",
            )
        self.num_pages = num_pages
        self.page_size = page_size
        # Handed out first: freed pages, last freed first (pop() from the end); then the pages never handed out,
        # in order from _fresh on, skipping the reserved ones (_fresh_left of them remain).
        self._free: list[int] = []
        self._reserved = keep
        self._fresh, self._fresh_left = 0, num_pages - len(keep)
        if seed is not None:
            free = [p for p in range(num_pages) if p not in keep]
            random.Random(seed).shuffle(free)
            self._free, self._fresh_left = free[::-1], 0  # pop() from the end hands out free[0] first
        self._pages: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._generation: dict[Hashable, int] = {}  # the step of each live request's latest slice
        self._steps = itertools.count(1)
        self._epoch: dict[int, int] = {}  # page -> the allocation that holds it (its PageIds carry the same)
        self._owner: dict[int, Hashable] = {}  # page -> the request that holds it
        self._allocations = itertools.count(1)

    # -- queries --------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free) + self._fresh_left

    def requests(self) -> list[Hashable]:
        return list(self._pages)

    def pages(self, request_id: Hashable) -> tuple[int, ...]:
        return tuple(self._pages[self._known(request_id)])

    def num_tokens(self, request_id: Hashable) -> int:
        return self._tokens.get(request_id, 0)

    # -- changes --------------------------------------------------------------------------------

    def allocate(self, request_id: Hashable, num_tokens: NonNegativeInt) -> tuple[int, ...]:
        """Make sure `request_id` has pages for `num_tokens` tokens in total; returns its pages (PageIds)."""
        pages = self._pages.setdefault(request_id, [])
        need = cdiv(num_tokens, self.page_size) - len(pages)
        if need > self.num_free:
            if not pages:
                del self._pages[request_id]
            raise CacheCapacityError(
                "the KV cache has too few free pages for this request",
                argument="num_tokens",
                expected=f"at most {(len(pages) + self.num_free) * self.page_size} tokens for request {request_id!r}",
                found=f"{num_tokens} tokens ({need} more pages of {self.page_size}, {self.num_free} free)",
                fix="free finished requests (PageAllocator.free) or allocate a cache with more pages",
            )
        for _ in range(max(0, need)):
            page, epoch = self._take(), next(self._allocations)
            self._epoch[page], self._owner[page] = epoch, request_id
            pages.append(_page(self, page, epoch, request_id))
        return tuple(pages)

    def _take(self) -> int:
        """The next free page: the last one freed, else the lowest never handed out (not reserved)."""
        if self._free:
            return self._free.pop()
        page = self._fresh
        while page in self._reserved:
            page += 1
        self._fresh, self._fresh_left = page + 1, self._fresh_left - 1
        return page

    def append(self, request_id: Hashable, q_len: PositiveInt) -> SequenceSlice:
        """Add q_len new tokens to a request (prefill or decode); returns its slice of the step."""
        kv_len = self.num_tokens(request_id) + q_len
        pages = self.allocate(request_id, kv_len)
        self._tokens[request_id] = kv_len
        generation = self._generation[request_id] = next(self._steps)
        return SequenceSlice(q_len, kv_len, pages, request_id, Lease(self, request_id, generation))

    def free(self, request_id: Hashable) -> None:
        pages = self._pages.pop(self._known(request_id))
        self._tokens.pop(request_id, None)
        self._generation.pop(request_id, None)
        for page in pages:
            del self._epoch[int(page)], self._owner[int(page)]
        self._free.extend(int(p) for p in reversed(pages))

    def block_table(
        self, request_ids: Sequence[Hashable], pages_per_seq: PositiveInt, *, pad: NonNegativeInt = 0
    ) -> list[list[int]]:
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
