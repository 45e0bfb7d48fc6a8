"""Typed errors and warnings of maxtext-compat.

Every error says what was wrong (the argument or key), what was expected, what was
found, and how to fix it, so a user never has to read our source to recover.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any


class CompatError(Exception):
    """Base class of every error raised by maxtext-compat."""

    def __init__(
        self,
        message: str,
        *,
        argument: str | None = None,
        expected: Any = None,
        found: Any = None,
        fix: str | None = None,
    ) -> None:
        self.message = message
        self.argument = argument
        self.expected = expected
        self.found = found
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.message.rstrip(".") + "."]
        if self.argument is not None:
            parts.insert(0, f"[{self.argument}]")
        if self.expected is not None:
            parts.append(f"Expected: {self.expected}.")
        if self.found is not None:
            parts.append(f"Found: {self.found}.")
        if self.fix:
            parts.append(f"Fix: {self.fix}")
        return " ".join(parts)


class MatrixError(CompatError, ValueError):
    """compat_matrix.yaml is missing, malformed, or breaks the schema."""

    def __init__(self, message: str, *, path: str, key: str = "", **kw: Any) -> None:
        self.path = path
        self.key = key
        where = f"{path}: {key}" if key else path
        super().__init__(message, argument=where, **kw)


class ResolutionError(CompatError, LookupError):
    """No matrix row fits the installed (or given) versions."""


class IncompatibleVersionsError(ResolutionError):
    """The matrix marks this combination of versions as incompatible."""


class ProbeMismatchError(CompatError, RuntimeError):
    """The installed MaxText behaves differently from its matrix row (strict mode)."""


class InvalidArgumentError(CompatError, ValueError):
    """A caller passed a value we cannot use or translate."""


class InvalidArgumentTypeError(CompatError, TypeError):
    """A caller passed a value of the wrong type."""


class EnvironmentBuildError(CompatError, RuntimeError):
    """A matrix environment could not be created."""


class UnknownReleaseWarning(UserWarning):
    """An installed release is not in the matrix; the nearest row is used."""


class TracedBeforeInstallWarning(UserWarning):
    """A shim profile was installed after JAX compiled functions that may have traced its targets."""


class ProbeMismatchWarning(UserWarning):
    """The installed MaxText disagrees with its matrix row (non-strict mode)."""


class KernelUnavailableError(CompatError, RuntimeError):
    """The attention kernel cannot run as asked here: tpu-inference is missing, its version lacks
    the requested feature, or the kernel needs the CPU shim on a CPU backend."""


class ShimRefusedError(CompatError, RuntimeError):
    """A shim refused to install: unverified jax, or applied after the code it patches was traced."""


class CacheCapacityError(InvalidArgumentError):
    """A request needs more KV-cache pages or tokens than the cache (or the padded batch) holds."""


class StaleSliceError(InvalidArgumentError):
    """A SequenceSlice (or metadata built from it) outlived its request's pages: the request was freed, or a
    newer step was cut for it. Writing with it would overwrite tokens that now belong to someone else."""


class PatchError(CompatError, RuntimeError):
    """A shim could not be installed or removed; nothing was changed unless the message says rollback failed."""


class PatchTargetError(PatchError, LookupError):
    """A patch target cannot be imported, found, read or written."""


class PatchConflictError(PatchError):
    """A patch target is wrapped or replaced by someone else (at install), or our patch was (at uninstall)."""


class ProfileError(PatchError, LookupError):
    """A shim profile is unknown, registered twice, or cannot be built or chosen."""


class ServingError(CompatError, RuntimeError):
    """Serving a MaxText model through vLLM / tpu-inference cannot proceed as configured."""


class ServingConfigError(ServingError, ValueError):
    """vLLM's configuration (config.json, flags, additional_config) and the MaxText config disagree."""


class BackendUnavailableError(ServingError, LookupError):
    """No serving backend can run the installed MaxText release (e.g. the backport is not installed)."""


class WeightsUnavailableError(ServingError):
    """The served model has no weights to load: no checkpoint path and not `--load-format dummy`."""


class WeightsMismatchError(CompatError, ValueError):
    """A parameter tree does not fit the model it is loaded into: paths missing, extra, or of another shape.

    `missing` / `extra` list paths ('a/b/c'); `mismatched` lists (path, found shape, expected shape).
    """

    def __init__(
        self,
        message: str,
        *,
        missing: list[str] | None = None,
        extra: list[str] | None = None,
        mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] | None = None,
        **kw: Any,
    ) -> None:
        self.missing = list(missing or [])
        self.extra = list(extra or [])
        self.mismatched = list(mismatched or [])
        super().__init__(message, **kw)


class ConventionMismatchError(CompatError, TypeError):
    """A call contradicts the declared caller convention (e.g. names kv_cache= under `legacy`)."""


class BackportError(CompatError, RuntimeError):
    """The backported vLLM path cannot run this call (e.g. a scanned stack)."""


class CrossRunError(CompatError, RuntimeError):
    """A run in another environment failed or produced no result."""


class OldConventionError(CompatError, RuntimeError):
    """An old-convention call under policy `error`, or past the matrix's `ends_in` release."""


class KVCacheNotUpdatedError(CompatError, RuntimeError):
    """Strict mode: a new call returned no KV cache, or returned it untouched after a step that writes it."""


# --- warnings at the user's line ------------------------------------------------------------

_INTERNAL = ("maxtext_compat.", "flax.", "jax.", "jax._src", "contextlib", "functools")


def user_frame() -> types.FrameType:
    """The first frame outside maxtext-compat, flax and jax: the user's line that made the call."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_INTERNAL) and name not in ("maxtext_compat", "flax", "jax"):
            return frame
        frame = frame.f_back
    return frame


def warn_at_call_site(message: str, category: type[Warning]) -> None:
    """Warn at the user's line (the first frame outside maxtext-compat, flax and jax), once per line."""
    frame = user_frame()
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message, category, frame.f_code.co_filename, frame.f_lineno, module=frame.f_globals.get("__name__"),
        registry=registry,
    )  # fmt: skip
