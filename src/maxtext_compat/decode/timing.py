"""Wall-clock a jitted call without counting its compilation.

Why: on CPU a new shape compiles for 2.5-10 s while a warm step runs in ~0.1-0.3 s, so a
per-step table is meaningless unless compile time is split off. A call that compiled is run once
more (jit is functional: same inputs, same outputs) so the timed call is a warm one. What counts
as "compiled": the function's own trace (`TraceCountingJit`). Not jax's process-wide compile events:
the Pallas interpreter compiles helpers inside its host callbacks the first time a process meets a
shape. Not the jit's own `_cache_size`: its C++ dispatch cache also grows when only an argument's
sharding spelling or committedness changes, without any compile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from maxtext_compat.locks import fork_safe_lock

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_lock = fork_safe_lock()
_events = 0
_installed = False


def _listener(event: str, duration: float, **_: Any) -> None:
    global _events
    if event in COMPILE_EVENTS:
        with _lock:
            _events += 1


def compile_events() -> int:
    """How many trace/lower/compile events jax reported in this process so far."""
    global _installed
    if not _installed:
        import jax

        with _lock:
            if not _installed:
                jax.monitoring.register_event_duration_secs_listener(_listener)
                _installed = True
    return _events


class TraceCountingJit:
    """jax.jit(fn) that counts its own traces: a trace is what every (re)compile of it starts with."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        import jax

        self.traces = 0

        def body(*args: Any) -> Any:
            self.traces += 1  # runs only while tracing
            return fn(*args)

        self._jitted = jax.jit(body)

    def __call__(self, *args: Any) -> Any:
        return self._jitted(*args)


def timed_call(fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """(result, warm seconds, compile seconds: 0.0 when nothing compiled) of fn(*args), outputs ready.

    "Compiled" is `fn`'s own trace when it is a TraceCountingJit, else any compile event in the process."""
    import jax

    count: Callable[[], int] = (lambda: fn.traces) if isinstance(fn, TraceCountingJit) else compile_events
    before = count()
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    seconds = time.perf_counter() - start
    if count() == before:
        return out, seconds, 0.0
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start, seconds
