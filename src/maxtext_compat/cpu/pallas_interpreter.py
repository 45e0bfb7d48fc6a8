"""Where jax keeps the pieces of its Pallas TPU interpreter: they moved in every minor release.

Why one module: the CPU shim touches three things inside the interpreter (the get/store/swap
callbacks, the pallas_call interpreter's memory-space rules, its per-run state). Each lives in
a different module depending on the jax release, measured on the installs the kernel tests run:
jax 0.7 keeps everything in `interpret`; 0.8.0 moved the callbacks to `interpret.shared_memory`
and the rest to `interpret.interpret_pallas_call`; 0.8.1 on keeps both in the latter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

_PACKAGE = "jax._src.pallas.mosaic.interpret"
CALLBACK_MODULES = (f"{_PACKAGE}.interpret_pallas_call", f"{_PACKAGE}.shared_memory", _PACKAGE)
PALLAS_CALL_MODULES = (f"{_PACKAGE}.interpret_pallas_call", _PACKAGE)
CALLBACKS: tuple[str, ...] = ("get", "store", "swap")


def callbacks_module() -> ModuleType:
    """The module whose get/store/swap the interpreter (and its DMAs) call."""
    return _first(CALLBACK_MODULES, lambda mod: all(callable(getattr(mod, n, None)) for n in CALLBACKS))


def pallas_call_module() -> ModuleType:
    """The module that interprets a pallas_call (memory-space rules, per-run state)."""
    return _first(PALLAS_CALL_MODULES, lambda mod: hasattr(mod, "reset_tpu_interpret_mode_state"))


def _first(names: tuple[str, ...], fits: Callable[[ModuleType], bool]) -> ModuleType:
    importlib.import_module("jax.experimental.pallas.tpu")  # public module first: jax 0.7's internals import in a cycle
    for name in names:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if fits(mod):
            return mod
    raise ImportError(f"this jax's Pallas TPU interpreter is in none of {list(names)}")
