"""Ragged batch -> the metadata tpu-inference's RPA kernel needs, validated before the kernel runs.

Why validate here: the kernel trusts its metadata. A q_len of 0, a page id out of range or a
kv_len beyond the block table reads or writes the wrong memory silently (TPU) or dies deep in
the interpreter (CPU); a decode sequence listed after a prefill is computed with the wrong
static q_len. Every check below names the sequence and field at fault and says how to fix it.

What the kernel wants (tpu-inference v3, every release 0.11-0.32):
* sequences ordered decode-first (q_len == 1), then the rest;
* `distribution` = (decode end, prefill-only end, total): the sharded wrapper never runs the
  prefill-only segment (it passes no chunk_prefill_size), so like tpu-inference's runner we
  always emit (d, d, n) and reject anything else;
* `cu_q_lens` (`query_start_loc`) [max_num_seqs + 1], `kv_lens` (`seq_lens`) [max_num_seqs],
  flattened `page_indices` (`block_tables`) [max_num_seqs * pages_per_seq], all int32;
* the new tokens of sequence i are q rows [cu_q_lens[i], cu_q_lens[i+1]) and go to positions
  [kv_len - q_len, kv_len) of its pages.

Since sequences are reordered, the metadata keeps the permutation (`request_order`,
`token_order`) so callers can put their tokens into kernel order and the outputs back.
The core is pure python; numpy/jax are imported only by the conversion methods.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError
from maxtext_compat.paged.allocator import SequenceSlice
from maxtext_compat.paged.layout import KVCacheLayout, cdiv

KERNEL_FIELDS = ("kv_lens", "page_indices", "cu_q_lens", "distribution")
# Our names -> tpu-inference AttentionMetadata field names (the same in every release).
ATTENTION_METADATA_FIELDS = {
    "input_positions": "input_positions",
    "page_indices": "block_tables",
    "kv_lens": "seq_lens",
    "cu_q_lens": "query_start_loc",
    "distribution": "request_distribution",
}


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class RaggedMetadata:
    """Kernel-ready metadata of one step (host-side ints; see `arrays()` / `to_attention_metadata()`)."""

    kv_lens: tuple[int, ...]
    page_indices: tuple[int, ...]
    cu_q_lens: tuple[int, ...]
    distribution: tuple[int, int, int]
    input_positions: tuple[int, ...]
    page_size: int
    num_pages: int
    request_order: tuple[int, ...]  # kernel sequence i is the caller's seqs[request_order[i]]
    token_order: tuple[int, ...]  # kernel token t is the caller's token token_order[t]
    request_ids: tuple[Hashable | None, ...] = ()

    @property
    def max_num_seqs(self) -> int:
        return len(self.kv_lens)

    @property
    def max_num_tokens(self) -> int:
        return len(self.input_positions)

    @property
    def pages_per_seq(self) -> int:
        return len(self.page_indices) // len(self.kv_lens)

    @property
    def num_seqs(self) -> int:
        return self.distribution[2]

    @property
    def num_decode(self) -> int:
        return self.distribution[0]

    @property
    def num_tokens(self) -> int:
        return self.cu_q_lens[self.num_seqs]

    def q_lens(self) -> list[int]:
        return [self.cu_q_lens[i + 1] - self.cu_q_lens[i] for i in range(self.num_seqs)]

    def pages_of(self, seq: int) -> tuple[int, ...]:
        """Pages in use by kernel sequence `seq` (its block-table row cut at kv_len)."""
        n = cdiv(self.kv_lens[seq], self.page_size)
        start = seq * self.pages_per_seq
        return self.page_indices[start : start + n]

    # -- conversions ----------------------------------------------------------------------------

    def arrays(self) -> dict[str, Any]:
        """numpy int32 arrays, keyed by our field names (kv_lens, page_indices, cu_q_lens, distribution, ...)."""
        import numpy as np

        return {
            "kv_lens": np.asarray(self.kv_lens, np.int32),
            "page_indices": np.asarray(self.page_indices, np.int32),
            "cu_q_lens": np.asarray(self.cu_q_lens, np.int32),
            "distribution": np.asarray(self.distribution, np.int32),
            "input_positions": np.asarray(self.input_positions, np.int32),
        }

    def kernel_arrays(self) -> tuple[Any, Any, Any, Any]:
        """(kv_lens, page_indices, cu_q_lens, distribution) as jax int32 arrays."""
        import jax.numpy as jnp

        a = self.arrays()
        return tuple(jnp.asarray(a[name]) for name in KERNEL_FIELDS)  # type: ignore[return-value]

    def to_attention_metadata(self, cls: Any = None) -> Any:
        """tpu-inference's own AttentionMetadata (the object MaxText's vLLM path receives).

        cls: the class to build (default: the installed tpu-inference's, found through the
        compat matrix row of the installed version).
        """
        import jax.numpy as jnp

        if cls is None:
            from maxtext_compat.rpa import attention_metadata_class

            cls = attention_metadata_class()
        a = self.arrays()
        return cls(**{theirs: jnp.asarray(a[ours]) for ours, theirs in ATTENTION_METADATA_FIELDS.items()})

    def _token_index(self) -> Any:
        import numpy as np

        return np.asarray(self.token_order, np.int64)

    def to_kernel_order(self, x: Any, *, pad_value: float = 0.0) -> Any:
        """Caller-ordered token rows [num_tokens, ...] -> kernel order, padded to [max_num_tokens, ...].

        pad_value fills the padding rows (NaN there proves they never leak into real rows).
        """
        import numpy as np

        if x.shape[0] != self.num_tokens:
            raise InvalidArgumentError(
                "token rows do not match the batch",
                argument="x",
                expected=f"{self.num_tokens} rows (the batch's tokens in caller order)",
                found=f"{x.shape[0]} rows",
                fix=f"pass x with one row per new token of this step ({self.num_tokens} rows, in the order of the "
                "sequences given to build_metadata), unpadded",
            )
        rows = x[self._token_index()]
        pad_rows = self.max_num_tokens - self.num_tokens
        if pad_rows == 0:
            return rows
        if isinstance(x, np.ndarray):
            pad = np.full((pad_rows, *x.shape[1:]), pad_value, dtype=x.dtype)
            return np.concatenate([rows, pad])
        import jax.numpy as jnp

        return jnp.concatenate([rows, jnp.full((pad_rows, *x.shape[1:]), pad_value, dtype=x.dtype)])

    def from_kernel_order(self, y: Any) -> Any:
        """Kernel-ordered rows [max_num_tokens, ...] -> the caller's order [num_tokens, ...]."""
        import numpy as np

        inverse = np.empty(self.num_tokens, np.int64)
        inverse[self._token_index()] = np.arange(self.num_tokens)
        return y[inverse]


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


def build_metadata(
    seqs: Sequence[SequenceSlice],
    layout: KVCacheLayout,
    *,
    max_num_tokens: int | None = None,
    max_num_seqs: int | None = None,
    pages_per_seq: int | None = None,
) -> RaggedMetadata:
    """Order the batch decode-first and build validated kernel metadata.

    Padded sizes default to powers of two (max_num_tokens >= 8) so a serving loop reuses a few
    compiled shapes; pass them explicitly to pin one shape (tests compile once that way).
    """
    seqs = list(seqs)
    if not seqs:
        raise InvalidArgumentError(
            "a step needs at least one sequence", argument="seqs", found="[]", fix="skip the kernel call"
        )
    check_sequences(seqs, layout)
    total = sum(s.q_len for s in seqs)
    need_pages = max(cdiv(s.kv_len, layout.page_size) for s in seqs)
    max_num_tokens = max(8, next_pow2(total)) if max_num_tokens is None else max_num_tokens
    max_num_seqs = next_pow2(len(seqs)) if max_num_seqs is None else max_num_seqs
    pages_per_seq = next_pow2(need_pages) if pages_per_seq is None else pages_per_seq
    if total > max_num_tokens:
        raise CacheCapacityError(
            "the batch has more tokens than the padded token capacity",
            argument="max_num_tokens",
            expected=f">= {total} (the batch's new tokens)",
            found=max_num_tokens,
            fix="raise max_num_tokens (vLLM: max_num_batched_tokens) or split the step",
        )
    if len(seqs) > max_num_seqs:
        raise CacheCapacityError(
            "the batch has more sequences than max_num_seqs",
            argument="max_num_seqs",
            expected=f">= {len(seqs)}",
            found=max_num_seqs,
            fix="raise max_num_seqs or split the step",
        )
    if need_pages > pages_per_seq:
        raise CacheCapacityError(
            "a sequence needs more pages than a block-table row holds",
            argument="pages_per_seq",
            expected=f">= {need_pages} (longest kv_len / page_size)",
            found=pages_per_seq,
            fix="raise pages_per_seq (max model length / page_size)",
        )

    order = [i for i, s in enumerate(seqs) if s.is_decode] + [i for i, s in enumerate(seqs) if not s.is_decode]
    num_decode = sum(1 for s in seqs if s.is_decode)
    caller_start = [0]
    for s in seqs:
        caller_start.append(caller_start[-1] + s.q_len)

    kv_lens = [0] * max_num_seqs
    page_indices = [0] * (max_num_seqs * pages_per_seq)
    cu = [0] * (max_num_seqs + 1)
    positions = [0] * max_num_tokens
    token_order: list[int] = []
    for k, i in enumerate(order):
        s = seqs[i]
        kv_lens[k] = s.kv_len
        used = s.pages[: cdiv(s.kv_len, layout.page_size)]
        page_indices[k * pages_per_seq : k * pages_per_seq + len(used)] = used
        start = cu[k]
        for j in range(s.q_len):
            positions[start + j] = s.context_len + j
        token_order.extend(range(caller_start[i], caller_start[i] + s.q_len))
        cu[k + 1] = start + s.q_len
    for k in range(len(order) + 1, max_num_seqs + 1):
        cu[k] = cu[len(order)]
    md = RaggedMetadata(
        kv_lens=tuple(kv_lens),
        page_indices=tuple(page_indices),
        cu_q_lens=tuple(cu),
        distribution=(num_decode, num_decode, len(seqs)),
        input_positions=tuple(positions),
        page_size=layout.page_size,
        num_pages=layout.num_pages,
        request_order=tuple(order),
        token_order=tuple(token_order),
        request_ids=tuple(seqs[i].request_id for i in order),
    )
    check_metadata(
        md.kv_lens,
        md.page_indices,
        md.cu_q_lens,
        md.distribution,
        num_pages=layout.num_pages,
        page_size=layout.page_size,
        max_num_tokens=max_num_tokens,
    )
    return md


# --------------------------------------------------------------------------------------------
# Validation (pure python; the dispatcher runs check_metadata on concrete user arrays too)
# --------------------------------------------------------------------------------------------


def check_sequences(seqs: Sequence[SequenceSlice], layout: KVCacheLayout) -> None:
    """Per-sequence checks with the caller's indices in the messages."""
    for i, s in enumerate(seqs):
        where = f"seqs[{i}]" + (f" (request {s.request_id!r})" if s.request_id is not None else "")
        if s.q_len < 1:
            raise InvalidArgumentError(
                "a sequence in a step must add at least one token",
                argument=f"{where}.q_len",
                expected=">= 1",
                found=s.q_len,
                fix="drop sequences with nothing to compute from the step",
            )
        if s.q_len > s.kv_len:
            raise InvalidArgumentError(
                "q_len exceeds kv_len (kv_len counts the cached tokens plus this step's new ones)",
                argument=f"{where}.kv_len",
                expected=f">= q_len={s.q_len}",
                found=s.kv_len,
                fix="pass kv_len = tokens already cached + q_len",
            )
        if s.kv_len > layout.capacity_tokens:
            raise CacheCapacityError(
                "the sequence holds more tokens than the whole cache",
                argument=f"{where}.kv_len",
                expected=f"<= {layout.capacity_tokens} ({layout.num_pages} pages x {layout.page_size})",
                found=s.kv_len,
                fix="allocate a cache with more pages",
            )
        need = cdiv(s.kv_len, layout.page_size)
        if len(s.pages) < need:
            raise CacheCapacityError(
                "the sequence has too few pages for its kv_len",
                argument=f"{where}.pages",
                expected=f">= {need} pages for kv_len={s.kv_len} at page_size={layout.page_size}",
                found=f"{len(s.pages)} pages",
                fix="allocate the pages first (PageAllocator.append / allocate)",
            )
        for p in s.pages[:need]:
            if not 0 <= p < layout.num_pages:
                raise InvalidArgumentError(
                    "page id out of range",
                    argument=f"{where}.pages",
                    expected=f"ids in [0, {layout.num_pages})",
                    found=p,
                    fix="use page ids handed out by a PageAllocator of this cache",
                )


def check_metadata(
    kv_lens: Sequence[int],
    page_indices: Sequence[int],
    cu_q_lens: Sequence[int],
    distribution: Sequence[int],
    *,
    num_pages: int,
    page_size: int,
    max_num_tokens: int,
) -> None:
    """Validate kernel metadata values (lengths, ordering, ranges, write conflicts)."""
    max_num_seqs = len(kv_lens)
    if max_num_seqs < 1:
        raise InvalidArgumentError(
            "kv_lens is empty",
            argument="kv_lens",
            expected="[max_num_seqs] with >= 1 entry",
            found="0 entries",
            fix="pass kv_lens with one entry per batch slot (max_num_seqs >= 1), "
            "or build the metadata with maxtext_compat.paged.build_metadata",
        )
    if len(cu_q_lens) != max_num_seqs + 1:
        raise InvalidArgumentError(
            "cu_q_lens must have one more entry than kv_lens",
            argument="cu_q_lens",
            expected=f"length {max_num_seqs + 1}",
            found=f"length {len(cu_q_lens)}",
            fix=f"pass cu_q_lens with len(kv_lens) + 1 = {max_num_seqs + 1} entries (cumulative query lengths from 0), "
            "or build the metadata with maxtext_compat.paged.build_metadata",
        )
    if len(distribution) != 3:
        raise InvalidArgumentError(
            "distribution is (decode end, prefill-only end, total sequences)",
            argument="distribution",
            expected="length 3",
            found=f"length {len(distribution)}",
            fix="pass distribution as 3 int32 values (decode end, prefill-only end, total sequences), "
            "or build the metadata with maxtext_compat.paged.build_metadata",
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
    pages_per_seq = len(page_indices) // max_num_seqs
    d, p, n = (int(x) for x in distribution)
    if not 0 <= d <= p <= n <= max_num_seqs:
        raise InvalidArgumentError(
            "distribution must satisfy 0 <= decode_end <= prefill_end <= num_seqs <= max_num_seqs",
            argument="distribution",
            expected=f"0 <= d <= p <= n <= {max_num_seqs}",
            found=(d, p, n),
            fix="set distribution to (decode sequences, the same again, all sequences) with all sequences "
            f"<= max_num_seqs={max_num_seqs}, or build the metadata with maxtext_compat.paged.build_metadata",
        )
    if p != d:
        raise InvalidArgumentError(
            "a prefill-only segment would be skipped: tpu-inference's sharded RPA never passes chunk_prefill_size",
            argument="distribution",
            expected=f"(d, d, n), i.e. ({d}, {d}, {n})",
            found=(d, p, n),
            fix="put non-decode sequences in the mixed segment (maxtext_compat.paged.build_metadata does)",
        )
    if int(cu_q_lens[0]) != 0:
        raise InvalidArgumentError(
            "cu_q_lens must start at 0",
            argument="cu_q_lens[0]",
            expected=0,
            found=cu_q_lens[0],
            fix="make cu_q_lens cumulative from 0: cu_q_lens = [0, q_len_0, q_len_0 + q_len_1, ...]",
        )
    total = int(cu_q_lens[n])
    if total > max_num_tokens:
        raise CacheCapacityError(
            "the batch has more tokens than q/k/v rows",
            argument="cu_q_lens",
            expected=f"cu_q_lens[num_seqs] <= {max_num_tokens} (q.shape[0])",
            found=total,
            fix="pad q/k/v to at least the batch's token count",
        )
    writers: dict[int, int] = {}
    users: dict[int, list[int]] = {}
    for i in range(n):
        q_len = int(cu_q_lens[i + 1]) - int(cu_q_lens[i])
        kv_len = int(kv_lens[i])
        if q_len < 1:
            raise InvalidArgumentError(
                "every sequence in the batch must have at least one new token",
                argument=f"cu_q_lens[{i}:{i + 2}]",
                expected="strictly increasing up to num_seqs",
                found=f"q_len={q_len} for sequence {i}",
                fix="drop empty sequences and lower distribution[2]",
            )
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
                fix="raise pages_per_seq or shorten the sequence",
            )
        first_written = (kv_len - q_len) // page_size
        for j in range(need):
            page = int(page_indices[i * pages_per_seq + j])
            if not 0 <= page < num_pages:
                raise InvalidArgumentError(
                    "block table entry out of range",
                    argument=f"page_indices[{i * pages_per_seq + j}]",
                    expected=f"a page id in [0, {num_pages}) (sequence {i}, page {j})",
                    found=page,
                    fix="use page ids of this cache",
                )
            users.setdefault(page, []).append(i)
            if j >= first_written:
                if page in writers and writers[page] != i:
                    raise InvalidArgumentError(
                        "two sequences write new tokens into the same page",
                        argument="page_indices",
                        expected="pages written this step owned by one sequence",
                        found=f"page {page} written by sequences {writers[page]} and {i}",
                        fix="give each request its own pages (shared prefix pages must be full and read-only)",
                    )
                writers[page] = i
    for page, i in writers.items():
        others = sorted(set(users[page]) - {i})
        if others:
            raise InvalidArgumentError(
                "a page written this step is also read by another sequence",
                argument="page_indices",
                expected="pages written this step owned by one sequence",
                found=f"page {page} written by sequence {i}, read by {others}",
                fix="give each request its own pages (shared prefix pages must be full and read-only)",
            )
