"""A small paged KV cache and one-line ragged steps (the pytest plugin's `paged_kv_cache`, `attention_metadata_for`).

Why: every test of a paged new call needs the same bookkeeping (a layout that fits the model, one
cache per layer, pages per request, metadata in kernel order, tokens reordered to match). Here it
is one object and one call. The bookkeeping is pure python; jax is imported, and the CPU RPA shim
installed, the first time a jax array is handed out (caches, positions, AttentionMetadata), which
is always before the kernel is traced.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from maxtext_compat.errors import CompatError, InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.paged.allocator import PageAllocator, SequenceSlice
from maxtext_compat.paged.layout import KVCacheLayout
from maxtext_compat.paged.metadata import RaggedMetadata, build_metadata

DEFAULT_PAGES = 8
DEFAULT_PAGE_SIZE = 16
BATCH_HELP = "a list of (q_len, kv_len) pairs, or a mapping {request_id: q_len or (q_len, kv_len)}"


def ensure_kernel() -> Any:
    """Install the CPU RPA shim when tpu-inference is installed (idempotent); its status or None.

    Without tpu-inference there is no kernel to prepare: a new call then fails with the
    dispatcher's own KernelUnavailableError, which names the fix.
    """
    from maxtext_compat.versions import installed_versions

    if "tpu_inference" not in installed_versions():
        return None
    from maxtext_compat.cpu import rpa as cpu_rpa

    return cpu_rpa.install()


class PagedKVCache:
    """One paged KV cache per layer plus the page bookkeeping of the requests that use it."""

    def __init__(self, layout: KVCacheLayout, num_layers: int, *, mesh: Any = None, seed: int | None = None) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise InvalidArgumentError(
                "need at least one layer",
                argument="num_layers",
                expected="an int >= 1",
                found=repr(num_layers),
                fix="pass num_layers as the model's number of decoder layers (an int >= 1), one cache per layer",
            )
        self.layout = layout
        self.num_layers = num_layers
        self.mesh = mesh
        self.allocator = PageAllocator(layout.num_pages, layout.page_size, seed=seed)
        self._tokens: dict[Hashable, int] = {}
        self._caches: list[Any] | None = None

    @property
    def caches(self) -> list[Any]:
        """Zeroed caches, one per layer (allocated on first use; assign the caches a step returns)."""
        if self._caches is None:
            ensure_kernel()
            self._caches = self.layout.allocate(self.num_layers, mesh=self.mesh)
        return self._caches

    @caches.setter
    def caches(self, value: Sequence[Any]) -> None:
        self._caches = list(value)

    def num_tokens(self, request_id: Hashable) -> int:
        """Tokens a request holds after the steps built so far."""
        return self._tokens.get(request_id, 0)

    def read(self, request_id: Hashable, layer: int = 0) -> tuple[Any, Any]:
        """K and V a request holds in `layer`'s cache: numpy [tokens, num_kv_heads, head_dim]."""
        from maxtext_compat.paged.readback import read_kv

        return read_kv(self.caches[layer], self.layout, self.allocator.pages(request_id), self.num_tokens(request_id))

    def free(self, request_id: Hashable) -> None:
        """Release a finished request's pages."""
        self.allocator.free(request_id)
        self._tokens.pop(request_id, None)

    def step(
        self,
        batch: Sequence[Any] | Mapping[Hashable, Any],
        *,
        max_num_tokens: int | None = None,
        max_num_seqs: int | None = None,
        pages_per_seq: int | None = None,
    ) -> PagedStep:
        """Allocate pages for `batch` and build its kernel-order metadata (see `parse_batch`)."""
        __tracebackhide__ = True  # a bad batch is the caller's error: show their line and our message
        wanted = parse_batch(batch, self._tokens)
        try:
            seqs = [SequenceSlice(q, kv, self.allocator.allocate(rid, kv), rid) for rid, q, kv in wanted]
            md = build_metadata(
                seqs, self.layout, max_num_tokens=max_num_tokens, max_num_seqs=max_num_seqs, pages_per_seq=pages_per_seq
            )
        except CompatError as exc:
            for rid, _, _ in wanted:  # give back the pages of requests this failed step would have started
                if rid not in self._tokens and rid in self.allocator.requests():
                    self.allocator.free(rid)
            raise exc.with_traceback(None)  # noqa: B904 - the caller's line and our message are the story
        for rid, _, kv in wanted:
            self._tokens[rid] = kv
        return PagedStep(md, tuple(seqs), self)

    def __repr__(self) -> str:
        return f"PagedKVCache({self.num_layers} layers, {self.layout.describe()})"


def parse_batch(batch: Any, tokens: Mapping[Hashable, int]) -> list[tuple[Hashable, int, int]]:
    """(request_id, q_len, kv_len) per request, checked, with messages naming `batch[...]`.

    [(q_len, kv_len), ...]: request ids 0..n-1. {rid: q_len}: q_len new tokens after what the
    request already holds (so {"a": 1} after {"a": 20} is a decode at kv_len 21). {rid: (q_len, kv_len)}:
    explicit lengths (tokens before the step are taken as cached).
    """
    __tracebackhide__ = True
    if isinstance(batch, Mapping):
        items = list(batch.items())
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        items = list(enumerate(batch))
    else:
        raise InvalidArgumentTypeError(
            "a batch describes the requests of one step",
            argument="batch",
            expected=BATCH_HELP,
            found=repr(batch),
            fix="pass e.g. [(20, 20), (1, 14)] (a prefill of 20 tokens and a decode) or {'a': 1}",
        )
    if not items:
        raise InvalidArgumentError(
            "a step needs at least one request",
            argument="batch",
            expected=BATCH_HELP,
            found=repr(batch),
            fix="skip the step when no request has new tokens, or pass e.g. [(20, 20)]",
        )
    out: list[tuple[Hashable, int, int]] = []
    for key, spec in items:
        where = f"batch[{key!r}]"
        rid: Hashable = key
        if isinstance(spec, SequenceSlice):
            q_len, kv_len = spec.q_len, spec.kv_len
            rid = key if spec.request_id is None or isinstance(batch, Mapping) else spec.request_id
        elif _is_int(spec) and isinstance(batch, Mapping):
            q_len, kv_len = spec, tokens.get(rid, 0) + spec
        elif isinstance(spec, Sequence) and len(spec) == 2 and all(_is_int(v) for v in spec):
            q_len, kv_len = spec
        else:
            raise InvalidArgumentTypeError(
                "each request is (q_len, kv_len), or q_len in a mapping",
                argument=where,
                expected="two ints (new tokens this step, tokens in the cache after it)",
                found=repr(spec),
                fix="describe each request as (q_len, kv_len), e.g. (20, 20) for a 20-token prefill; a bare q_len "
                "works only in a mapping {request_id: q_len}",
            )
        if q_len < 1:
            raise InvalidArgumentError(
                "a request in a step adds at least one token",
                argument=where,
                expected="q_len >= 1",
                found=q_len,
                fix="leave requests with no new tokens out of the step",
            )
        if q_len > kv_len:
            raise InvalidArgumentError(
                "q_len exceeds kv_len",
                argument=where,
                expected=f"kv_len >= q_len={q_len} (kv_len counts the cached tokens plus this step's new ones)",
                found=f"(q_len={q_len}, kv_len={kv_len})",
                fix=f"a prefill is ({q_len}, {q_len}); a step after c cached tokens is ({q_len}, c + {q_len})",
            )
        if any(rid == seen for seen, _, _ in out):
            raise InvalidArgumentError(
                "a request appears twice in one step",
                argument=where,
                expected="each request id once per step",
                found=repr(rid),
                fix=f"merge the two entries of request {rid!r} into one (q_len = their new tokens together)",
            )
        out.append((rid, q_len, kv_len))
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class PagedStep:
    """One ragged step: metadata in kernel order (decodes first) and the helpers to reorder tokens."""

    metadata: RaggedMetadata
    sequences: tuple[SequenceSlice, ...]  # the caller's order
    cache: PagedKVCache

    @property
    def num_tokens(self) -> int:
        return self.metadata.num_tokens

    @property
    def max_num_tokens(self) -> int:
        """Rows of q/k/v and of the model's token input (the padded token count)."""
        return self.metadata.max_num_tokens

    @property
    def request_ids(self) -> tuple[Hashable | None, ...]:
        """Request ids in kernel order."""
        return self.metadata.request_ids

    @cached_property
    def attention_metadata(self) -> Any:
        """tpu-inference's own AttentionMetadata (what MaxText's vLLM path receives)."""
        ensure_kernel()
        return self.metadata.to_attention_metadata()

    @cached_property
    def positions(self) -> Any:
        """Token positions in kernel order as [max_num_tokens, 1] int32 (the model's position input)."""
        ensure_kernel()
        import jax.numpy as jnp

        return jnp.asarray(self.metadata.input_positions, jnp.int32)[:, None]

    @property
    def caches(self) -> list[Any]:
        return self.cache.caches

    def to_kernel_order(self, x: Any, *, pad_value: float = 0.0) -> Any:
        """Caller-ordered rows [num_tokens, ...] -> kernel order padded to [max_num_tokens, ...]."""
        return self.metadata.to_kernel_order(x, pad_value=pad_value)

    def from_kernel_order(self, y: Any) -> Any:
        """Kernel-ordered rows [max_num_tokens, ...] -> the caller's order [num_tokens, ...]."""
        return self.metadata.from_kernel_order(y)

    def tokens(self, token_ids: Any) -> Any:
        """Caller-ordered token ids [num_tokens] -> the model's token input [max_num_tokens, 1] int32."""
        import numpy as np

        ids = np.asarray(token_ids, np.int32).reshape(-1)
        ensure_kernel()
        import jax.numpy as jnp

        return jnp.asarray(self.to_kernel_order(ids))[:, None]
