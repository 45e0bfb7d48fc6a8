"""How the kernel dispatcher runs the Pallas kernel on a CPU backend: through a hook the CPU stand-in sets.

Why a hook: production code never imports the CPU emulation (`maxtext_compat.cpu`). On CPU devices the
dispatcher enters whatever interpret mode was installed (`maxtext_compat.cpu.rpa.install()` sets it and its
`uninstall()` takes it away), and refuses with a typed error when none was.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from maxtext_compat.errors import InvalidArgumentTypeError
from maxtext_compat.locks import fork_safe_lock

InterpretMode = Callable[[], AbstractContextManager[None]]

_LOCK = fork_safe_lock()
_MODE: list[InterpretMode | None] = [None]


def set_interpret_mode(mode: InterpretMode | None) -> InterpretMode | None:
    """Install (or, with None, remove) the context the kernel is traced in on CPU devices; returns the previous."""
    if mode is not None and not callable(mode):
        raise InvalidArgumentTypeError(
            "the interpret mode is not callable",
            argument="mode",
            expected="None, or a callable returning a context manager (maxtext_compat.cpu.rpa's pallas interpreter)",
            found=f"{type(mode).__name__} {mode!r}"[:200],
            fix="pass the function that returns the context (not the context itself), or None to remove it",
        )
    with _LOCK:
        previous, _MODE[0] = _MODE[0], mode
        return previous


def interpret_mode() -> InterpretMode | None:
    """The installed interpret mode, None when no CPU stand-in is installed."""
    return _MODE[0]


def on_cpu(devices: Any = None) -> bool:
    """Whether these devices (default: jax's default backend) are CPU devices."""
    import jax

    if devices is None:
        return jax.default_backend() == "cpu"
    return all(getattr(d, "platform", "") == "cpu" for d in devices)
