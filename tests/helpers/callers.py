"""Caller threads that keep calling patched code while the main thread churns a shim.

Why shared: every churn test needs the same harness: the threads start together (a barrier, so
the churn never begins before every caller runs), yield the GIL every few calls as real callers
do inside JAX, and stop and join on exit. A subclass says only what one thread does.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Self


class CallerThreads:
    """`count` threads running `step` in a loop between `__enter__` and `__exit__`; `calls[i]` counts thread i's."""

    def __init__(self, count: int, yield_every: int) -> None:
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.calls = [0] * count
        self.yield_every = yield_every
        self.started = threading.Barrier(count + 1)
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]

    def prepare(self, i: int) -> Any:
        """Thread i's set-up before the start barrier (e.g. its call sites); passed to every `step`."""
        return None

    def step(self, i: int, n: int, state: Any) -> None:
        """Thread i's n-th call; record a failure in `failures` instead of raising."""
        raise NotImplementedError

    def _run(self, i: int) -> None:
        state = self.prepare(i)
        self.started.wait()
        n = 0
        while not self.stop.is_set():
            self.step(i, n, state)
            n += 1
            if self.yield_every and n % self.yield_every == 0:
                time.sleep(0)
        self.calls[i] = n

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        self.started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
