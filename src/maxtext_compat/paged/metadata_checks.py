"""Value checks of ragged paged-attention metadata: every KV write lands where the metadata says, or it is refused.

Why one module: the kernel trusts its metadata (on TPU a bad value is silent memory corruption,
on CPU often a silently wrong cache), so every path that hands metadata to it runs these same
checks on host values: `build_metadata`, the RPA dispatcher, the adapters' new calls on every
release and the paged engine (see `maxtext_compat.paged.checks` for what runs when). They are
invariants over the whole metadata rather than a list of known bad cases, so a variation of a
mistake cannot slip through:

1. every value is an int (a float page id or length would be truncated by the int32 cast);
2. the segments agree: 0 <= decode_end == prefill_end <= num_seqs <= max_num_seqs; cu_q_lens
   starts at 0, never decreases, grows by >= 1 for each counted sequence and is flat after
   num_seqs, and kv_lens is 0 there (a slot the kernel skips must hold nothing, or its K/V is
   never written);
3. per counted sequence: 1 <= q_len <= kv_len, q_len == 1 in the decode segment, the pages it
   needs fit its block-table row, each is a page id of the cache and none is listed twice (a
   repeated page maps two positions onto one slot: tokens are lost);
4. across sequences: a page written this step belongs to that sequence alone, and a page read by
   several (a shared prefix) holds the same positions in each row (it is then full: the last
   page of every sequence is always written);
5. positions, when given: the rows of sequence i are exactly kv_len - q_len ... kv_len - 1 (RoPE
   of any other position would be applied to the K written at that slot).

Pure python: the unit environment (no numpy/jax) tests it.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Sequence
from typing import Annotated, Any

from maxtext_compat.contract import PositiveInt, checked
from maxtext_compat.contract.rules import all_of
from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.paged.allocator import PageId, SequenceSlice
from maxtext_compat.paged.layout import KVCacheLayout, cdiv

# The slices of one step: every item checked (a tuple or a dict in the list would fail deep inside).
Slices = Annotated[
    Sequence[SequenceSlice],
    all_of("a list of SequenceSlices", lambda s: isinstance(s, SequenceSlice),
           "pass {name} as a list of SequenceSlice (PageAllocator.append returns one per request)"),
]  # fmt: skip

BUILD_FIX = "or build the metadata with maxtext_compat.paged.build_metadata"


def as_int(value: Any, argument: str, what: str) -> int:
    """`value` as an int; a float, bool or other non-integer is a typed error (never truncated)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentTypeError(
            f"{what} must be an int (a {type(value).__name__} would be truncated)",
            argument=argument,
            expected="an int",
            found=f"{value!r} ({type(value).__name__})",
            fix=f"pass {argument} as an int (int32 arrays for the kernel); never round a page id or a length",
        )
    return int(value)


def ints(values: Sequence[Any], name: str, what: str) -> list[int]:
    return [as_int(v, f"{name}[{i}]", what) for i, v in enumerate(values)]


# --------------------------------------------------------------------------------------------
# Page ownership (shared by the caller-level and the array-level checks)
# --------------------------------------------------------------------------------------------


def page_conflict(rows: Sequence[tuple[Sequence[int], int]]) -> tuple[str, int, int, int, int, int] | None:
    """The first page-ownership violation among rows (pages needed, index of the first page written).

    Returns (kind, page, row a, index in a, row b, index in b) with kind 'repeated' (one row lists a
    page twice), 'written' (a page one row writes is used by another) or 'moved' (a shared page sits
    at different positions in two rows); None when every write has one owner.
    """
    seen: dict[int, tuple[int, int]] = {}  # page -> (row, index) of its first use
    writer: dict[int, tuple[int, int]] = {}
    for r, (pages, first_written) in enumerate(rows):
        mine: dict[int, int] = {}
        for j, page in enumerate(pages):
            if page in mine:
                return ("repeated", page, r, mine[page], r, j)
            mine[page] = j
            if j >= first_written:
                if page in seen:
                    a, ja = seen[page]
                    return ("written", page, a, ja, r, j)
                writer[page] = (r, j)
            elif page in writer:
                a, ja = writer[page]
                return ("written", page, a, ja, r, j)
            elif page in seen and seen[page][1] != j:
                a, ja = seen[page]
                return ("moved", page, a, ja, r, j)
            seen.setdefault(page, (r, j))
    return None


CONFLICT_TEXT = {
    "repeated": "a block-table row lists one page twice: two positions of the sequence map onto one slot and "
    "tokens are lost",
    "written": "two sequences use the same page and one of them writes it this step: one overwrites the other's tokens",
    "moved": "a page shared by two sequences holds different positions in each row",
}
CONFLICT_FIX = {
    "repeated": "give each position range its own page (PageAllocator.append hands out distinct pages)",
    "written": "give each request its own pages for new tokens (shared prefix pages must be full and read-only)",
    "moved": "share a prefix page only at the same block index in every row (it holds the same positions)",
}


# --------------------------------------------------------------------------------------------
# Caller level: the SequenceSlices of one step
# --------------------------------------------------------------------------------------------


@checked
def check_sequences(seqs: Slices, layout: KVCacheLayout) -> None:
    """Per-sequence and cross-sequence checks with the caller's indices (seqs[i]) in the messages."""
    ids: dict[Hashable, int] = {}
    rows: list[tuple[Sequence[int], int]] = []
    labels: list[str] = []
    for i, s in enumerate(seqs):
        where = f"seqs[{i}]" + (f" (request {s.request_id!r})" if s.request_id is not None else "")
        labels.append(where)
        q_len = as_int(s.q_len, f"{where}.q_len", "q_len")
        kv_len = as_int(s.kv_len, f"{where}.kv_len", "kv_len")
        pages = ints(s.pages, f"{where}.pages", "a page id")
        if s.request_id is not None:
            if s.request_id in ids:
                raise InvalidArgumentError(
                    "a request appears twice in one step",
                    argument=where,
                    expected="each request once per step",
                    found=f"request {s.request_id!r} at seqs[{ids[s.request_id]}] and seqs[{i}]",
                    fix="cut one slice per request per step (its q_len counts all its new tokens)",
                )
            ids[s.request_id] = i
        s.check_current(where)
        if q_len < 1:
            raise InvalidArgumentError(
                "a sequence in a step must add at least one token",
                argument=f"{where}.q_len",
                expected=">= 1",
                found=q_len,
                fix="drop sequences with nothing to compute from the step",
            )
        if q_len > kv_len:
            raise InvalidArgumentError(
                "q_len exceeds kv_len (kv_len counts the cached tokens plus this step's new ones)",
                argument=f"{where}.kv_len",
                expected=f">= q_len={q_len}",
                found=kv_len,
                fix="pass kv_len = tokens already cached + q_len",
            )
        if kv_len > layout.capacity_tokens:
            raise CacheCapacityError(
                "the sequence holds more tokens than the whole cache",
                argument=f"{where}.kv_len",
                expected=f"<= {layout.capacity_tokens} ({layout.num_pages} pages x {layout.page_size})",
                found=kv_len,
                fix="allocate a cache with more pages",
            )
        need = cdiv(kv_len, layout.page_size)
        if len(pages) < need:
            raise CacheCapacityError(
                "the sequence has too few pages for its kv_len",
                argument=f"{where}.pages",
                expected=f">= {need} pages for kv_len={kv_len} at page_size={layout.page_size}",
                found=f"{len(pages)} pages",
                fix="allocate the pages first (PageAllocator.append / allocate)",
            )
        for p in pages[:need]:
            if not 0 <= p < layout.num_pages:
                raise InvalidArgumentError(
                    "page id out of range",
                    argument=f"{where}.pages",
                    expected=f"ids in [0, {layout.num_pages})",
                    found=p,
                    fix="use page ids handed out by a PageAllocator of this cache",
                )
        rows.append((pages[:need], (kv_len - q_len) // layout.page_size))
    conflict = page_conflict(rows)
    if conflict is not None:
        kind, page, a, ja, b, jb = conflict
        raise InvalidArgumentError(
            CONFLICT_TEXT[kind],
            argument=f"{labels[b]}.pages",
            expected="pages written this step owned by one sequence, each listed once",
            found=f"page {page} at {labels[a]}.pages[{ja}] and {labels[b]}.pages[{jb}]",
            fix=CONFLICT_FIX[kind],
        )


# --------------------------------------------------------------------------------------------
# Array level: the four kernel arrays (and positions) as host values
# --------------------------------------------------------------------------------------------


@checked
def check_metadata(
    kv_lens: Sequence[int],
    page_indices: Sequence[int],
    cu_q_lens: Sequence[int],
    distribution: Sequence[int],
    *,
    num_pages: PositiveInt,
    page_size: PositiveInt,
    max_num_tokens: PositiveInt,
    input_positions: Sequence[int] | None = None,
    positions_name: str = "input_positions",
) -> None:
    """Validate kernel metadata values (see the module docstring for the invariants).

    The sequences' items are checked here (not by the contract) so an error names the entry: page_indices[3].
    Page ids an allocator handed out (block_table rows) must still be held by their request."""
    held = {i: p for i, p in enumerate(page_indices) if isinstance(p, PageId)}
    kv_lens = ints(kv_lens, "kv_lens", "a kv_len")
    page_indices = ints(page_indices, "page_indices", "a page id")
    cu_q_lens = ints(cu_q_lens, "cu_q_lens", "a cumulative query length")
    distribution = ints(distribution, "distribution", "a distribution entry")
    max_num_seqs = len(kv_lens)
    _check_lengths(kv_lens, page_indices, cu_q_lens, distribution)
    pages_per_seq = len(page_indices) // max_num_seqs
    d, p, n = distribution
    _check_segments(kv_lens, cu_q_lens, (d, p, n), max_num_tokens)
    rows: list[tuple[Sequence[int], int]] = []
    for i in range(n):
        q_len = cu_q_lens[i + 1] - cu_q_lens[i]
        kv_len = kv_lens[i]
        if q_len > kv_len:
            raise InvalidArgumentError(
                "q_len exceeds kv_len",
                argument=f"kv_lens[{i}]",
                expected=f">= q_len={q_len}",
                found=kv_len,
                fix="kv_lens counts the cached tokens plus this step's new ones",
            )
        if i < d and q_len != 1:
            raise InvalidArgumentError(
                "a sequence in the decode segment has more than one new token (the decode kernel assumes 1)",
                argument=f"cu_q_lens[{i}:{i + 2}]",
                expected="q_len == 1 for sequences [0, distribution[0])",
                found=f"q_len={q_len}",
                fix="order sequences decode-first and count only q_len == 1 ones in distribution[0]",
            )
        need = cdiv(kv_len, page_size)
        if need > pages_per_seq:
            raise CacheCapacityError(
                "kv_len needs more pages than a block-table row holds",
                argument=f"kv_lens[{i}]",
                expected=f"<= {pages_per_seq * page_size} ({pages_per_seq} pages x {page_size})",
                found=kv_len,
                fix="raise pages_per_seq or shorten the sequence; if the metadata was built for another page size, "
                "rebuild it for this cache's",
            )
        row = page_indices[i * pages_per_seq : i * pages_per_seq + need]
        for j, page in enumerate(row):
            if held and (k := i * pages_per_seq + j) in held:
                held[k].check(f"page_indices[{k}]")
            if not 0 <= page < num_pages:
                raise InvalidArgumentError(
                    "block table entry out of range",
                    argument=f"page_indices[{i * pages_per_seq + j}]",
                    expected=f"a page id in [0, {num_pages}) (sequence {i}, page {j})",
                    found=page,
                    fix="use page ids of this cache",
                )
        rows.append((row, (kv_len - q_len) // page_size))
    conflict = page_conflict(rows)
    if conflict is not None:
        kind, page, a, ja, b, jb = conflict
        raise InvalidArgumentError(
            CONFLICT_TEXT[kind],
            argument=f"page_indices[{b * pages_per_seq + jb}]",
            expected="pages written this step owned by one sequence, each listed once",
            found=f"page {page} at sequence {a} page {ja} and sequence {b} page {jb}",
            fix=CONFLICT_FIX[kind],
        )
    if input_positions is not None:
        check_positions(input_positions, kv_lens, cu_q_lens, n, name=positions_name)


def _check_lengths(kv_lens: list[int], page_indices: list[int], cu_q_lens: list[int], distribution: list[int]) -> None:
    max_num_seqs = len(kv_lens)
    if max_num_seqs < 1:
        raise InvalidArgumentError(
            "kv_lens is empty",
            argument="kv_lens",
            expected="[max_num_seqs] with >= 1 entry",
            found="0 entries",
            fix=f"pass kv_lens with one entry per batch slot (max_num_seqs >= 1), {BUILD_FIX}",
        )
    if len(cu_q_lens) != max_num_seqs + 1:
        raise InvalidArgumentError(
            "cu_q_lens must have one more entry than kv_lens",
            argument="cu_q_lens",
            expected=f"length {max_num_seqs + 1}",
            found=f"length {len(cu_q_lens)}",
            fix=f"pass cu_q_lens with len(kv_lens) + 1 = {max_num_seqs + 1} entries (cumulative query lengths "
            f"from 0), {BUILD_FIX}",
        )
    if len(distribution) != 3:
        raise InvalidArgumentError(
            "distribution is (decode end, prefill-only end, total sequences)",
            argument="distribution",
            expected="length 3",
            found=f"length {len(distribution)}",
            fix=f"pass distribution as 3 int32 values (decode end, prefill-only end, total sequences), {BUILD_FIX}",
        )
    if len(page_indices) == 0 or len(page_indices) % max_num_seqs:
        raise InvalidArgumentError(
            "page_indices is the flattened [max_num_seqs, pages_per_seq] block table",
            argument="page_indices",
            expected=f"a non-zero multiple of max_num_seqs={max_num_seqs} entries",
            found=f"{len(page_indices)} entries",
            fix="pass page_indices as the block table flattened to max_num_seqs * pages_per_seq entries "
            f"({max_num_seqs} rows; PageAllocator.block_table(...) builds them, padded with page 0)",
        )


def _check_segments(kv_lens: list[int], cu_q_lens: list[int], dist: tuple[int, int, int], max_num_tokens: int) -> None:
    """Invariant 2: distribution, cu_q_lens and kv_lens describe the same num_seqs sequences."""
    d, p, n = dist
    max_num_seqs = len(kv_lens)
    if not 0 <= d <= p <= n <= max_num_seqs:
        raise InvalidArgumentError(
            "distribution must satisfy 0 <= decode_end <= prefill_end <= num_seqs <= max_num_seqs",
            argument="distribution",
            expected=f"0 <= d <= p <= n <= {max_num_seqs}",
            found=dist,
            fix="set distribution to (decode sequences, the same again, all sequences) with all sequences "
            f"<= max_num_seqs={max_num_seqs}, {BUILD_FIX}",
        )
    if p != d:
        raise InvalidArgumentError(
            "a prefill-only segment would be skipped: tpu-inference's sharded RPA never passes chunk_prefill_size",
            argument="distribution",
            expected=f"(d, d, n), i.e. ({d}, {d}, {n})",
            found=dist,
            fix="put non-decode sequences in the mixed segment (maxtext_compat.paged.build_metadata does)",
        )
    if cu_q_lens[0] != 0:
        raise InvalidArgumentError(
            "cu_q_lens must start at 0",
            argument="cu_q_lens[0]",
            expected=0,
            found=cu_q_lens[0],
            fix="make cu_q_lens cumulative from 0: cu_q_lens = [0, q_len_0, q_len_0 + q_len_1, ...]",
        )
    for i in range(max_num_seqs):
        if cu_q_lens[i + 1] < cu_q_lens[i]:
            raise InvalidArgumentError(
                "cu_q_lens must never decrease (it is cumulative)",
                argument=f"cu_q_lens[{i + 1}]",
                expected=f">= cu_q_lens[{i}]={cu_q_lens[i]}",
                found=cu_q_lens[i + 1],
                fix="make cu_q_lens cumulative from 0 and flat after the last sequence, " + BUILD_FIX,
            )
        if i < n and cu_q_lens[i + 1] == cu_q_lens[i]:
            raise InvalidArgumentError(
                "every sequence in the batch must have at least one new token",
                argument=f"cu_q_lens[{i}:{i + 2}]",
                expected="strictly increasing up to num_seqs",
                found=f"q_len=0 for sequence {i}",
                fix="drop empty sequences and lower distribution[2]",
            )
        if i >= n and (cu_q_lens[i + 1] != cu_q_lens[i] or kv_lens[i] != 0):
            found = f"q_len={cu_q_lens[i + 1] - cu_q_lens[i]}, kv_len={kv_lens[i]} in slot {i}"
            raise InvalidArgumentError(
                f"a sequence slot past num_seqs=distribution[2]={n} holds tokens: the kernel skips it, so its "
                "K/V would never be written",
                argument="distribution",
                expected=f"distribution[2] counting every sequence, or slots {n}.. empty (cu_q_lens flat, kv_lens 0)",
                found=found,
                fix="set distribution[2] to the number of sequences with tokens (and zero kv_lens / repeat the last "
                f"cu_q_lens entry for padding slots), {BUILD_FIX}",
            )
        if kv_lens[i] < 0:
            raise InvalidArgumentError(
                "kv_lens must be >= 0",
                argument=f"kv_lens[{i}]",
                expected=">= 0",
                found=kv_lens[i],
                fix="kv_lens counts the cached tokens plus this step's new ones",
            )
    total = cu_q_lens[n]
    if total > max_num_tokens:
        raise CacheCapacityError(
            "the batch has more tokens than q/k/v rows",
            argument="cu_q_lens",
            expected=f"cu_q_lens[num_seqs] <= {max_num_tokens} (q.shape[0])",
            found=total,
            fix="pad q/k/v to at least the batch's token count",
        )


def check_positions(
    positions: Sequence[Any], kv_lens: Sequence[int], cu_q_lens: Sequence[int], num_seqs: int, *, name: str
) -> None:
    """Invariant 5: token row t of sequence i has position kv_len - q_len + (t - cu_q_lens[i])."""
    values = positions if isinstance(positions, list) else list(positions)
    total = int(cu_q_lens[num_seqs])
    if len(values) < total:
        raise InvalidArgumentError(
            "positions have fewer rows than the batch has tokens",
            argument=name,
            expected=f">= {total} rows (one per token, kernel order)",
            found=f"{len(values)} rows",
            fix=f"pass one position per token row ({name} in the metadata's kernel order)",
        )
    for i in range(num_seqs):
        start, stop = int(cu_q_lens[i]), int(cu_q_lens[i + 1])
        first = int(kv_lens[i]) - (stop - start)
        for t in range(start, stop):
            got = as_int(values[t], f"{name}[{t}]", "a position")
            if got != first + t - start:
                raise InvalidArgumentError(
                    "a token's position differs from where the metadata writes its K/V (RoPE would rotate K for "
                    "the wrong position)",
                    argument=f"{name}[{t}]",
                    expected=f"{first + t - start} (sequence {i}: kv_len {kv_lens[i]}, q_len {stop - start})",
                    found=got,
                    fix="pass positions = kv_len - q_len ... kv_len - 1 for each sequence, in kernel order "
                    "(RaggedMetadata.input_positions)",
                )
