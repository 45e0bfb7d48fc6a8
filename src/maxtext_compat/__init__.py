"""maxtext-compat: call any MaxText release with either call convention and serve it with vLLM.

`import maxtext_compat` is deliberately light: it imports neither jax nor MaxText. Heavy
pieces (adapters, shims, the paged KV cache) load on first use. Every error class a user meets is exported here
(they live in `maxtext_compat.errors`; a refused served request's class, derived where vLLM is installed, is
caught as `RequestRefusedError`), so one import catches any of them: a unit test holds it.

>>> from importlib.metadata import version
>>> import maxtext_compat
>>> maxtext_compat.__version__ == version("maxtext-compat")  # the installed distribution's version
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping  # at run time: the contract evaluates resolve's hints in this namespace

from maxtext_compat._lazy import on_first_call
from maxtext_compat._moved import install as _install_moved_paths
from maxtext_compat._version import __version__
from maxtext_compat.errors import (
    BackendUnavailableError,
    BackportError,
    CacheCapacityError,
    CompatError,
    ConventionMismatchError,
    CrossRunError,
    EnvironmentBuildError,
    IncompatibleVersionsError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    KernelUnavailableError,
    KVCacheNotUpdatedError,
    MatrixError,
    OldConventionError,
    PatchConflictError,
    PatchError,
    PatchTargetError,
    PluginMismatchError,
    ProbeMismatchError,
    ProbeMismatchWarning,
    ProfileError,
    RequestRefusedError,
    ResolutionError,
    ServingConfigError,
    ServingError,
    ShimRefusedError,
    StaleSliceError,
    TracedBeforeInstallWarning,
    UnknownReleaseWarning,
    WeightsMismatchError,
    WeightsUnavailableError,
)

# Module paths that moved import as the new module, with a DeprecationWarning (docs/architecture.md).
_install_moved_paths()

# Not typing's: typing costs `import maxtext_compat` ~8 ms (re, enum, contextlib); see errors.py.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from maxtext_compat.matrix import CompatMatrix
    from maxtext_compat.resolution.resolver import Resolution

    F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "BackendUnavailableError",
    "BackportError",
    "CacheCapacityError",
    "CompatError",
    "ConventionMismatchError",
    "CrossRunError",
    "EnvironmentBuildError",
    "IncompatibleVersionsError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "KVCacheNotUpdatedError",
    "KernelUnavailableError",
    "MatrixError",
    "OldConventionError",
    "PatchConflictError",
    "PatchError",
    "PatchTargetError",
    "PluginMismatchError",
    "ProbeMismatchError",
    "ProbeMismatchWarning",
    "ProfileError",
    "RequestRefusedError",
    "ResolutionError",
    "ServingConfigError",
    "ServingError",
    "ShimRefusedError",
    "StaleSliceError",
    "TracedBeforeInstallWarning",
    "UnknownReleaseWarning",
    "WeightsMismatchError",
    "WeightsUnavailableError",
    "__version__",
    "load_matrix",
    "resolve",
]


def _checked(fn: F) -> F:
    """`contract.checked(fn)` made at the first call: the contract package stays out of `import maxtext_compat`."""

    def make(f: F) -> Any:
        from maxtext_compat.contract import checked

        return checked(f)

    return on_first_call(fn, make)


@_checked
def resolve(
    versions: Mapping[str, str] | None = None,
    *,
    matrix: CompatMatrix | None = None,
    strict: bool = False,
    probe: bool | None = None,
) -> Resolution:
    """Match installed (versions=None) or given versions to compat_matrix.yaml rows (see resolver.resolve).

    >>> import maxtext_compat
    >>> res = maxtext_compat.resolve({"maxtext": "0.2.2", "tpu-inference": "0.20.0"})
    >>> res.convention, res.rpa_call_form()["form"]
    ('kv_scan_carry', 'flat')
    """
    from maxtext_compat.resolution.resolver import resolve as _resolve

    return _resolve(versions, matrix=matrix, strict=strict, probe=probe)


@_checked
def load_matrix(path: str | os.PathLike[str] | None = None) -> CompatMatrix:
    """Load and validate compat_matrix.yaml (or `path`).

    >>> import maxtext_compat
    >>> m = maxtext_compat.load_matrix()
    >>> [row.name for row in m.maxtext][:3], m.row("0.1.0").convention
    (['0.1.0', '0.2.0', '0.2.1'], 'legacy')
    """
    from maxtext_compat.matrix import load_matrix as _load

    return _load(path)
