"""A placeholder `torchvision` for the TPU machine, whose index has torch 2.13.0+cpu but no torchvision built for it
(PyPI's torchvision 0.28.0 links libtorch_cuda: `RuntimeError: operator torchvision::nms does not exist` at import).

Why: loading any model, tpu-inference 0.25.0's model loader imports every architecture it knows
(`_get_model_architecture`), among them vLLM's Gemma4 multimodal model, whose transformers processor module imports
`torchvision.transforms.v2` at module level even when transformers itself reports torchvision absent. A text model
never calls it. The placeholder answers those imports (any attribute is another placeholder; calling one raises),
after transformers' own checks have cached "torchvision is absent", so no code path that asks uses it. A test aid
for the TPU tier's vLLM test only (tests/tpu/test_tier_vllm.py), installed only where the real import fails.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

PREFIX = "torchvision"


class Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, key: str) -> Placeholder:
        if key.startswith("__"):
            raise AttributeError(key)
        return Placeholder(f"{self._name}.{key}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} was called, but torchvision is a placeholder here (no build for this torch)")

    def __repr__(self) -> str:
        return f"<torchvision placeholder {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, key: str) -> Placeholder:
        if key.startswith("__"):
            raise AttributeError(key)
        return Placeholder(f"{self.__name__}.{key}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == PREFIX or name.startswith(PREFIX + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_FINDER = _Finder()


def _drop_modules() -> None:
    for name in [n for n in sys.modules if n == PREFIX or n.startswith(PREFIX + ".")]:
        del sys.modules[name]


def install() -> str | None:
    """Install the placeholder where `import torchvision` fails; returns that failure (None: the real one imports)."""
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached now, before the placeholder could be found
    import_utils.is_torchvision_v2_available()
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # ImportError, or RuntimeError from a build for another torch
        _drop_modules()
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        return f"{type(exc).__name__}: {exc}"
    return None


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
        _drop_modules()
