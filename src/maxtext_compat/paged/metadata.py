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

import contextlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Annotated, Any

from maxtext_compat.contract import Array, PositiveInt, Rule, checked
from maxtext_compat.errors import CacheCapacityError, InvalidArgumentError
from maxtext_compat.paged.allocator import Lease, PageLease
from maxtext_compat.paged.layout import KVCacheLayout, cdiv
from maxtext_compat.paged.metadata_checks import Slices, check_metadata, check_sequences

__all__ = ["RaggedMetadata", "build_metadata", "check_metadata", "check_sequences", "metadata_arrays", "source_of"]
# The attribute `to_attention_metadata` sets on tpu-inference's AttentionMetadata: the RaggedMetadata it
# came from, so a later eager call can check its page size and that its requests were not freed since.
SOURCE_ATTR = "_maxtext_compat_source"

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


@checked
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
    # Per kernel sequence, the allocator lease it was cut from (None: a hand-made slice); see check_current.
    leases: tuple[Lease | PageLease | None, ...] = field(default=(), compare=False, repr=False)

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

    def check_current(self, argument: str = "metadata") -> None:
        """StaleSliceError when a request of this step was freed or stepped again since it was built.

        Why: metadata outlives the step it was built for (a kept PagedStep, an AttentionMetadata
        reused after `free`); its pages may belong to another request by now.
        """
        for i, lease in enumerate(self.leases):
            if lease is not None:
                lease.check(f"{argument} (kernel sequence {i}, request {lease.request_id!r})")

    def check_cache(self, num_pages: PositiveInt, page_size: PositiveInt, argument: str = "metadata") -> None:
        """The cache it is used with must be the one it was built for (pages of another size move every token)."""
        if (self.page_size, self.num_pages) != (page_size, num_pages):
            raise InvalidArgumentError(
                "the metadata was built for another cache",
                argument=argument,
                expected=f"page_size {page_size}, {num_pages} pages (the kv_cache's)",
                found=f"page_size {self.page_size}, {self.num_pages} pages",
                fix="build the metadata with the layout of this kv_cache",
            )

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

    def to_attention_metadata(self, cls: Callable[..., Any] | None = None) -> Any:
        """tpu-inference's own AttentionMetadata (the object MaxText's vLLM path receives).

        cls: the class to build (default: the installed tpu-inference's, found through the
        compat matrix row of the installed version).
        """
        import jax.numpy as jnp

        if cls is None:
            from maxtext_compat.resolution.installed_kernel import attention_metadata_class

            cls = attention_metadata_class()
        a = self.arrays()
        md = cls(**{theirs: jnp.asarray(a[ours]) for ours, theirs in ATTENTION_METADATA_FIELDS.items()})
        with contextlib.suppress(AttributeError, TypeError):  # a slotted class: only the array checks apply
            object.__setattr__(md, SOURCE_ATTR, self)  # eager calls check page size and leases (not a pytree field)
        return md

    def _token_index(self) -> Any:
        import numpy as np

        return np.asarray(self.token_order, np.int64)

    def to_kernel_order(self, x: Array, *, pad_value: float = 0.0) -> Any:
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

    def from_kernel_order(self, y: Array) -> Any:
        """Kernel-ordered rows [max_num_tokens, ...] -> the caller's order [num_tokens, ...]."""
        import numpy as np

        inverse = np.empty(self.num_tokens, np.int64)
        inverse[self._token_index()] = np.arange(self.num_tokens)
        return y[inverse]


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


@checked
def build_metadata(
    seqs: Slices,
    layout: KVCacheLayout,
    *,
    max_num_tokens: PositiveInt | None = None,
    max_num_seqs: PositiveInt | None = None,
    pages_per_seq: PositiveInt | None = None,
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
        used = [int(p) for p in s.pages[: cdiv(s.kv_len, layout.page_size)]]  # PageIds: their leases are kept
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
        leases=tuple(seqs[i].lease for i in order),
    )
    check_metadata(
        md.kv_lens,
        md.page_indices,
        md.cu_q_lens,
        md.distribution,
        num_pages=layout.num_pages,
        page_size=layout.page_size,
        max_num_tokens=max_num_tokens,
        input_positions=md.input_positions,
    )
    return md


def is_metadata(md: object) -> bool:
    """Ours, or an object carrying the kernel's four arrays (tpu-inference's AttentionMetadata)."""
    return isinstance(md, RaggedMetadata) or all(
        hasattr(getattr(md, n, None), "shape") and hasattr(getattr(md, n, None), "dtype")
        for n in ("seq_lens", "block_tables", "query_start_loc", "request_distribution")
    )


# What a kernel call takes as its metadata: ours, or tpu-inference's with its four arrays set.
Metadata = Annotated[
    Any,
    Rule(
        "a maxtext_compat.paged.RaggedMetadata, or tpu-inference's AttentionMetadata with seq_lens, block_tables, "
        "query_start_loc and request_distribution set as int32 arrays",
        is_metadata,
        "build it with maxtext_compat.paged.build_metadata(...) (its .to_attention_metadata() gives "
        "tpu-inference's); Python lists are not arrays: jnp.asarray(x, jnp.int32)",
        is_type=True,
    ),
]


def source_of(metadata: Any) -> RaggedMetadata | None:
    """The RaggedMetadata a metadata object is or was built from (None: hand-made or traced)."""
    if isinstance(metadata, RaggedMetadata):
        return metadata
    found = getattr(metadata, SOURCE_ATTR, None)
    return found if isinstance(found, RaggedMetadata) else None


def metadata_arrays(metadata: Any) -> tuple[Any, Any, Any, Any]:
    """(kv_lens, page_indices, cu_q_lens, distribution) from our RaggedMetadata or tpu-inference's."""
    if isinstance(metadata, RaggedMetadata):
        return metadata.kernel_arrays()
    names = ("seq_lens", "block_tables", "query_start_loc", "request_distribution")
    if all(getattr(metadata, n, None) is not None for n in names):
        return tuple(getattr(metadata, n) for n in names)  # type: ignore[return-value]
    raise InvalidArgumentError(
        "metadata must carry the kernel's four arrays",
        argument="metadata",
        expected="maxtext_compat.paged.RaggedMetadata or tpu-inference AttentionMetadata with seq_lens, "
        "block_tables, query_start_loc and request_distribution set",
        found=type(metadata).__name__,
        fix="build it with maxtext_compat.paged.build_metadata(...)",
    )
