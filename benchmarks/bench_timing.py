"""What every section of bench_tpu.py measures with: medians of repeated runs ended by block_until_ready, first
calls told apart from programs loaded from JAX's persistent compilation cache, and the device's memory. Apart from
bench_tpu.py so that its sections (bench_accel_step.py) import it without importing bench_tpu."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def hbm() -> dict[str, float] | None:
    """GiB in use and peak on device 0 (None where the backend keeps no statistics, as on CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats:
        return None
    gib = 1 << 30
    return {k: round(stats[k] / gib, 3) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}


def median_call(fn: Callable[[], Any], calls: int, runs: int) -> tuple[float, float, float]:
    """(median, min, max) seconds per call over `runs` runs of `calls` calls each (the outputs ready at the end)."""
    import jax

    per_call = []
    for _ in range(runs):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn()
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call), min(per_call), max(per_call)


# persistent compilation cache (tools/tpu/env.sh turns it on): programs loaded from it, programs compiled
_CACHE = {"/jax/compilation_cache/cache_hits": 0, "/jax/compilation_cache/cache_misses": 0}


def count_cache_events() -> None:
    import jax

    def listener(event: str, **_: Any) -> None:
        if event in _CACHE:
            _CACHE[event] += 1

    jax.monitoring.register_event_listener(listener)


class Cached:
    """Around a first call: True when every program it needed came from the cache (its seconds are no compile
    time), False when any was compiled."""

    def __enter__(self) -> Cached:
        self.before = dict(_CACHE)
        self.cached = False
        return self

    def __exit__(self, *exc: Any) -> None:
        hits, misses = (_CACHE[k] - self.before[k] for k in _CACHE)
        self.cached = hits > 0 and misses == 0


def first_call(fn: Callable[[], Any]) -> tuple[float, bool]:
    """(seconds of the first call: trace, lower, compile, run; whether its programs all came from the cache)."""
    import jax

    with Cached() as c:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        seconds = time.perf_counter() - start
    return seconds, c.cached
