"""Freed pages cannot be written through: a state machine over allocate/append/free/reuse, read back by an oracle.

Requests are started, extended, freed and their pages handed to new requests; the test keeps what a careless
caller keeps (a request's page list, copied into a list or sliced, and the metadata of past steps) and later
writes with it. Every write goes through `build_metadata` into a fake cache (page -> slots) exactly as the
kernel places K/V: position p of kernel sequence i at page_indices[i][p // page_size], slot p % page_size.

The oracle is independent of the allocator: it tracks which request owns which page from what the allocator
handed out, each live request's tokens by position, and which slices are current. After every rule each live
request reads back exactly its own tokens from its pages (a write through a freed page would show up as
another request's token), a write with stale pages is a StaleSliceError, and stale metadata is refused.
The bookkeeping needs no kernel; tests/compat/test_paged_stateful.py drives the real one.
"""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

from maxtext_compat import paged
from maxtext_compat.errors import CacheCapacityError, StaleSliceError

pytestmark = pytest.mark.envs("unit")

PAGES, PAGE = 10, 4
LAYOUT = paged.KVCacheLayout(PAGES, PAGE, 1, 128)
SEEN: collections.Counter[str] = collections.Counter()  # which outcomes the run reached (asserted below)


class Pages(RuleBasedStateMachine):
    kept = Bundle("kept")  # (request, its pages as the caller kept them, its token count then)
    steps = Bundle("steps")  # (metadata, {request: the oracle's generation of its slice})

    def __init__(self) -> None:
        super().__init__()
        self.alloc = paged.PageAllocator(PAGES, PAGE, seed=3)
        self.cache: dict[int, list[object]] = {p: [None] * PAGE for p in range(PAGES)}
        self.owner: dict[int, object] = {}  # the oracle's own page ownership
        self.tokens: dict[object, list[object]] = {}  # live request -> its token at each position
        self.generation: dict[object, int] = {}  # live request -> its latest appended slice
        self.ids = itertools.count()
        self.clock = itertools.count(1)

    # -- the oracle's view of a write --------------------------------------------------------------

    def _write(self, md: paged.RaggedMetadata, values: dict[object, list[object]]) -> None:
        """The fake kernel: each new token at the slot its kernel sequence's block-table row names."""
        per_seq = md.pages_per_seq
        for i in range(md.num_seqs):
            rid, q_len, kv_len = md.request_ids[i], md.q_lens()[i], md.kv_lens[i]
            row = md.page_indices[i * per_seq : (i + 1) * per_seq]
            for j, pos in enumerate(range(kv_len - q_len, kv_len)):
                self.cache[row[pos // PAGE]][pos % PAGE] = values[rid][j]

    def _take(self, rid: object, pages: tuple[int, ...]) -> None:
        for p in pages:
            assert self.owner.get(int(p), rid) == rid, (
                f"page {p} handed to {rid!r} while {self.owner[int(p)]!r} holds it"
            )
            self.owner[int(p)] = rid

    def _step(self, wanted: list[tuple[object, int]]) -> paged.RaggedMetadata | None:
        need = sum(-(-(len(self.tokens.get(r, [])) + q) // PAGE) - len(self._held(r)) for r, q in wanted)
        if need > self.alloc.num_free:
            return None  # the overflow rule checks the refusal
        slices = [self.alloc.append(rid, q) for rid, q in wanted]
        values: dict[object, list[object]] = {}
        for s in slices:
            self._take(s.request_id, s.pages)
            self.generation[s.request_id] = next(self.clock)
            values[s.request_id] = [
                (s.request_id, pos, self.generation[s.request_id]) for pos in range(s.context_len, s.kv_len)
            ]
        md = paged.build_metadata(slices, LAYOUT, max_num_tokens=64, max_num_seqs=4, pages_per_seq=PAGES)
        self._write(md, values)
        for rid, vals in values.items():
            self.tokens.setdefault(rid, []).extend(vals)
        return md

    def _held(self, rid: object) -> list[int]:
        return [p for p, o in self.owner.items() if o == rid]

    # -- rules -------------------------------------------------------------------------------------

    @rule(target=steps, lengths=st.lists(st.integers(1, 9), min_size=1, max_size=2),
          grow=st.lists(st.integers(1, 5), max_size=2), data=st.data())  # fmt: skip
    def step(self, lengths: list[int], grow: list[int], data: st.DataObject) -> object:
        """New requests and some live ones extended, in one ragged step."""
        live = sorted(self.tokens, key=str)
        extended = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=len(grow))) if live else []
        wanted = [(next(self.ids), n) for n in lengths] + list(zip(extended, grow, strict=False))
        md = self._step(wanted)
        if md is None:
            return (None, {})
        return (md, {rid: self.generation[rid] for rid, _ in wanted})

    @rule(extra=st.integers(1, PAGE))
    def overflow(self, extra: int) -> None:
        """A request that needs more pages than are free is refused and changes nothing."""
        free, before = self.alloc.num_free, {r: self.alloc.pages(r) for r in self.alloc.requests()}
        SEEN["overflow refused"] += 1
        with pytest.raises(CacheCapacityError):
            self.alloc.append(next(self.ids), free * PAGE + extra)
        assert self.alloc.num_free == free and {r: self.alloc.pages(r) for r in self.alloc.requests()} == before

    @precondition(lambda self: bool(self.tokens))
    @rule(target=kept, data=st.data(), how=st.sampled_from(["tuple", "list", "slice"]))
    def keep_pages(self, data: st.DataObject, how: str) -> object:
        """A caller keeps a request's pages (as the allocator handed them, copied into a list, or sliced)."""
        rid = data.draw(st.sampled_from(sorted(self.tokens, key=str)))
        pages = self.alloc.pages(rid)
        count = len(self.tokens[rid])
        kept = {"tuple": pages, "list": list(pages), "slice": pages[: -(-count // PAGE)]}[how]
        return (rid, kept, count)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.tokens, key=str)))
        self.alloc.free(rid)
        for p in self._held(rid):
            del self.owner[p]
        del self.tokens[rid], self.generation[rid]

    @rule(entry=kept, q=st.integers(1, 3))
    def rewrite_with_kept_pages(self, entry: tuple[object, list[int], int], q: int) -> None:
        """Rewrite a request's last tokens through a slice built by hand from pages kept earlier."""
        rid, pages, count = entry
        q = min(q, count)
        if q < 1:
            return
        seq = paged.SequenceSlice(q, count, pages, rid)
        if rid not in self.tokens:  # freed since: its pages may be another request's now
            SEEN["stale pages refused"] += 1
            with pytest.raises(StaleSliceError):
                paged.build_metadata([seq], LAYOUT, max_num_tokens=64, max_num_seqs=4, pages_per_seq=PAGES)
            return
        md = paged.build_metadata([seq], LAYOUT, max_num_tokens=64, max_num_seqs=4, pages_per_seq=PAGES)
        SEEN["kept pages written"] += 1
        stamp = next(self.clock)
        values = [(rid, pos, f"rewrite {stamp}") for pos in range(count - q, count)]
        self._write(md, {rid: values})
        self.tokens[rid][count - q : count] = values

    @rule(entry=consumes(steps))
    def reuse_old_metadata(self, entry: tuple[paged.RaggedMetadata | None, dict[object, int]]) -> None:
        """Metadata of a past step is current only while none of its requests was freed or stepped again."""
        md, generations = entry
        if md is None:
            return
        current = all(self.generation.get(rid) == gen for rid, gen in generations.items())
        SEEN[f"old metadata {'current' if current else 'stale'}"] += 1
        if current:
            md.check_current()
        else:
            with pytest.raises(StaleSliceError):
                md.check_current()

    # -- what must hold after every rule -----------------------------------------------------------

    @invariant()
    def every_live_request_reads_back_its_own_tokens(self) -> None:
        for rid, tokens in self.tokens.items():
            pages = self.alloc.pages(rid) if rid in self.alloc.requests() else ()
            got = [self.cache[pages[pos // PAGE]][pos % PAGE] for pos in range(len(tokens))]
            assert got == tokens, f"request {rid!r} reads back another request's tokens"

    @invariant()
    def ownership_agrees_with_the_allocator(self) -> None:
        held = {int(p): rid for rid in self.alloc.requests() for p in self.alloc.pages(rid)}
        assert held == self.owner
        assert self.alloc.num_free + len(held) == PAGES


def test_freed_pages_cannot_be_written_through():
    budget = settings(max_examples=120, stateful_step_count=25, deadline=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
    Pages.TestCase.settings = budget
    SEEN.clear()
    Pages.TestCase().runTest()
    reached = {
        "stale pages refused",
        "kept pages written",
        "old metadata current",
        "old metadata stale",
        "overflow refused",
    }
    assert reached <= set(SEEN), SEEN  # the run reached every case it is about
    assert SEEN["stale pages refused"] >= 20, SEEN


def test_the_issue_case_a_slice_from_pages_freed_and_handed_to_another_request():
    """Found: SequenceSlice(q, kv, pages) built from pages freed and reallocated wrote over the new owner's K/V."""
    alloc = paged.PageAllocator(4, 4)
    pages = alloc.pages(alloc.append("a", 8).request_id)  # two pages of "a"
    alloc.free("a")
    alloc.append("b", 8)  # "b" gets the same two pages
    seq = paged.SequenceSlice(1, 8, pages, "a")
    for built in (seq, paged.SequenceSlice(1, 8, list(pages))):  # as kept, and copied without the request id
        with pytest.raises(StaleSliceError, match="belongs to request 'b' now") as err:
            paged.build_metadata([built], paged.KVCacheLayout(4, 4, 1, 128))
        assert err.value.argument.startswith("seqs[0]") and "Fix:" in str(err.value)
    md = paged.build_metadata([paged.SequenceSlice(1, 8, alloc.pages("b"), "b")], paged.KVCacheLayout(4, 4, 1, 128))
    alloc.free("b")
    with pytest.raises(StaleSliceError):
        md.check_current()  # metadata of a hand-made slice is checked like an appended one's
    with pytest.raises(StaleSliceError, match=r"page_indices\[0\]"):  # a kept block-table row too
        paged.check_metadata([8], [*pages, 0, 0], [0, 1], [0, 0, 1], num_pages=4, page_size=4, max_num_tokens=8)


def test_pages_pickle_and_copy_as_plain_ints():
    import copy
    import pickle

    alloc = paged.PageAllocator(4, 4)
    pages = alloc.allocate("a", 5)
    assert pickle.loads(pickle.dumps(pages)) == pages and type(pickle.loads(pickle.dumps(pages))[0]) is int
    assert type(copy.deepcopy(pages)[0]) is int and repr(pages) == repr(tuple(int(p) for p in pages))
