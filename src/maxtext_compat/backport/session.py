"""The per-call KV session that routes a 0.1.0 model's attention to ragged paged attention."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.convention.translate import layer_entry
from maxtext_compat.errors import BackportError, InvalidArgumentError


@dataclass
class KVSession:
    """Caches in (per layer, call order), caches out, and what the attention op needs."""

    caches: Sequence[Any]
    metadata: Any
    rpa_mesh: Any
    where: str
    route: bool = True  # False: only record the hidden state (a train-mode new call)
    updated: list[Any] = field(default_factory=list)
    hidden: Any = None

    def take(self) -> tuple[int, Any]:
        """The next layer's index and input cache (layers call attention in order)."""
        i = len(self.updated)
        if i >= len(self.caches):
            raise InvalidArgumentError(
                f"more attention layers ran than KV caches were given to {self.where}",
                argument="kv_caches",
                expected=f"one cache per attention layer (at least {i + 1})",
                found=f"{len(self.caches)} cache(s)",
                fix="allocate one KV cache per decoder layer (maxtext_compat.paged.KVCacheLayout.allocate)",
            )
        return i, self.caches[i]

    def metadata_of(self, layer: int) -> Any:
        """The metadata of the `layer`-th attention layer: the one given, or its entry of a per-layer dict
        (several KV-cache groups, as tpu-inference hands them to MaxText 0.2.5)."""
        md = self.metadata
        return layer_entry(md, layer) if isinstance(md, Mapping) else md

    def give(self, cache: Any) -> None:
        self.updated.append(cache)

    def check_complete(self) -> None:
        if len(self.updated) != len(self.caches):
            raise InvalidArgumentError(
                f"{self.where} ran {len(self.updated)} attention layer(s) but got {len(self.caches)} KV caches",
                argument="kv_caches",
                expected=f"{len(self.updated)} caches (one per attention layer)",
                found=len(self.caches),
                fix="pass exactly one KV cache per decoder layer",
            )


_CURRENT: contextvars.ContextVar[KVSession | None] = contextvars.ContextVar("maxtext_compat_kv_session", default=None)


def current() -> KVSession | None:
    return _CURRENT.get()


@contextmanager
def kv_session(
    caches: Sequence[Any], metadata: Any, rpa_mesh: Any, where: str, *, route: bool = True
) -> Iterator[KVSession]:
    """Run the body with attention routed to RPA; nested sessions are refused (one model call at a time)."""
    if _CURRENT.get() is not None:
        raise BackportError(
            f"{where} was called inside another backported vLLM call",
            argument="kv_cache",
            expected="one new-convention call at the outermost level",
            found=f"a nested call inside {_CURRENT.get().where}",  # type: ignore[union-attr]
            fix="call the inner module the old way; the outer call threads the KV caches",
        )
    session = KVSession(list(caches), metadata, rpa_mesh, where, route)
    token = _CURRENT.set(session)
    try:
        yield session
    finally:
        _CURRENT.reset(token)
