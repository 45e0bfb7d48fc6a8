"""A small stderr progress bar for long CPU stages (compiling the RPA kernel takes seconds).

Why not tqdm: one more dependency for one bar; and the demo must show liveness while a single
call compiles, which needs a ticking thread rather than per-item updates.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """`with progress.stage("compiling"):` shows `[###-----] 3/8 compiling (4.2 s)` until the stage ends."""

    def __init__(self, total: int, *, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())

    def _line(self, label: str, elapsed: float) -> str:
        filled = int(self.width * self.done / max(self.total, 1))
        return f"[{'#' * filled}{'-' * (self.width - filled)}] {self.done}/{self.total} {label} ({elapsed:.1f} s)"

    @contextmanager
    def stage(self, label: str) -> Iterator[None]:
        start = time.monotonic()
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(0.25):
                self.stream.write("\r" + self._line(label, time.monotonic() - start))
                self.stream.flush()

        ticker = threading.Thread(target=tick, daemon=True) if self.live else None
        if ticker is not None:
            ticker.start()
        try:
            yield
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            self.done += 1
            self.stream.write(("\r" if self.live else "") + self._line(label, time.monotonic() - start) + "\n")
            self.stream.flush()
