"""torchax 0.0.13 on torch 2.13: the TPU machine's only torch (a CPU build in its wheel folder) dropped the aten
`Dimname` overloads that torchax names in its cast-policy and decomposition tables at import time
(`torch.ops.aten.prod.dim_Dimname`: AttributeError), so `import tpu_inference` fails there. Named-dimension
overloads are never called on the RPA or MaxText paths; a lookup of one that torch no longer has returns a
placeholder key instead of raising. Test aid for the TPU tier only (tests/tpu/conftest.py), not the library."""

from __future__ import annotations

from typing import Any

PATCHED: list[str] = []  # the overload names answered with a placeholder (tests/tpu check it stays small)


class RemovedOverload:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<aten overload removed in this torch: {self.name}>"


def allow_removed_dimname_overloads() -> bool:
    """Patch torch's op-packet lookup where the installed torch lacks the Dimname overloads; True if patched."""
    import torch
    import torch._ops as ops

    if hasattr(torch.ops.aten.prod, "dim_Dimname") or getattr(ops.OpOverloadPacket, "_mc_dimname", False):
        return False
    lookup = ops.OpOverloadPacket.__getattr__

    def getattr_(self: Any, key: str) -> Any:
        try:
            return lookup(self, key)
        except AttributeError:
            if "dimname" not in key.lower():
                raise
            name = f"{self._qualified_op_name}.{key}"
            PATCHED.append(name)
            return RemovedOverload(name)

    ops.OpOverloadPacket.__getattr__ = getattr_  # type: ignore[method-assign]
    ops.OpOverloadPacket._mc_dimname = True  # type: ignore[attr-defined]
    return True
