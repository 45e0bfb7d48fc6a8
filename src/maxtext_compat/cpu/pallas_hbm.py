"""Make the Pallas TPU interpreter of jax < 0.9 hand HBM kernel operands over by reference, as a TPU does.

Why: tpu-inference's RPA kernel declares its q, kv and cache operands `memory_space=pltpu.HBM` and
aliases the cache to its output. The interpreters of jax 0.7 and 0.8 treat only `ANY` operands as
the pallas_call's own buffers: an `HBM` operand gets a fresh uninitialised buffer, the kernel's
writes land there, and the cache it returns is NaN except the new tokens (measured: tpu-inference
0.11.1 on jax 0.7.2, 129,024 of 131,072 cache values NaN, attention output correct). jax 0.9's
interpreter maps ANY to HBM itself, so there is nothing to do there.

How: `HBM` counts as `ANY` — `_is_any` accepts it, and its memory-space index is ANY's, so DMAs
through HBM refs address the very buffers the pallas_call allocated for its operands.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.cpu.pallas_interpreter import pallas_call_module
from maxtext_compat.patching.settings import Setting, attribute_slot, item_slot


def settings() -> list[Setting]:
    """The two settings where the interpreter copies HBM operands ([] where it does not)."""
    interpreter = pallas_call_module()
    is_any = getattr(interpreter, "_is_any", None)
    if is_any is None:
        return []  # jax >= 0.9: HBM operands are already the pallas_call's buffers
    # the memory-space index the pallas_call interpreter reads: its own (0.7, 0.8.1) or its memory module's (0.8.0)
    index = getattr(interpreter, "TPU_MEMORY_SPACE_IDXS", None)
    if index is None:
        index = interpreter.memory.TPU_MEMORY_SPACE_IDXS
    from jax._src.pallas.mosaic import core as mosaic_core

    hbm, any_ = mosaic_core.MemorySpace.HBM, mosaic_core.MemorySpace.ANY
    if is_any(hbm):
        return []

    def is_any_or_hbm(memory_space: Any) -> bool:
        return memory_space == hbm or is_any(memory_space)

    name = interpreter.__name__
    return [
        Setting(attribute_slot(interpreter, "_is_any", f"{name}:_is_any"), is_any_or_hbm, f"{__name__}.settings"),
        Setting(item_slot(index, hbm, f"{name}:TPU_MEMORY_SPACE_IDXS[HBM]"), index[any_], f"{__name__}.settings"),
    ]
