"""A write path that checks nothing, for testing how calls are routed where no jax is installed.

Why: a writing new call's checks (`maxtext_compat.backport.write_path`) read real arrays (the caches' layouts, the
metadata's values, the positions) and need jax; the call rule above them is plain Python and takes its write
path from the call site. An adapter built inside `checkless_calls()` gets this one, which has the real one's
shape: it records what `prepare` was handed instead of checking it, and runs the real `legacy_call` (the 0.1.0
backport). Anything that writes a real cache must be tested with the real write path, on arrays.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from maxtext_compat.backport.write_path import WritePath
from maxtext_compat.shims.backport_hooks import WRITE_PATH


class ChecklessWritePath(WritePath):
    """The real write path with `prepare` recording instead of checking."""

    __slots__ = ("prepared",)

    def __init__(self) -> None:
        super().__init__(ensure_hooks=WRITE_PATH.ensure_hooks)
        self.prepared: list[Any] = []  # the translated call of every writing call, in order

    def prepare(self, kind: Any, module: Any, row: Any, t: Any, where: str) -> None:
        self.prepared.append(t)


@contextmanager
def checkless_calls() -> Iterator[ChecklessWritePath]:
    """Adapters and rule shims built inside the block get a `ChecklessWritePath` (they keep it afterwards)."""
    fake = ChecklessWritePath()
    with (
        mock.patch("maxtext_compat.adapters.wrapper.WRITE_PATH", fake),
        mock.patch("maxtext_compat.shims.rule_patches.WRITE_PATH", fake),
    ):
        yield fake
