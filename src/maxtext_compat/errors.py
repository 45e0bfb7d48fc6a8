"""Typed errors and warnings of maxtext-compat.

Every error says what was wrong (the argument or key), what was expected, what was
found, and how to fix it, so a user never has to read our source to recover.
"""

from __future__ import annotations

import sys
import types
import warnings

# Not `from typing import ...`: typing brings re, enum and contextlib (~8 ms) into `import maxtext_compat`, and
# these names are only annotations (strings here); type checkers read a TYPE_CHECKING name as typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class CompatError(Exception):
    """Base class of every error raised by maxtext-compat.

    Catch it to handle any of them; each names the argument, what was expected and found, and the fix:

    >>> from maxtext_compat import CompatError, resolve
    >>> try:
    ...     resolve({"maxtext": "zero"})
    ... except CompatError as err:
    ...     print(type(err).__name__, err.argument, "|", err.fix)
    InvalidArgumentError versions['maxtext'] | pass the release number as published on PyPI
    """

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
    """compat_matrix.yaml is missing, malformed, or breaks the schema.

    >>> from maxtext_compat import MatrixError, load_matrix
    >>> try:
    ...     load_matrix("nope.yaml")
    ... except MatrixError as err:
    ...     print(err.path, "|", err.fix)
    nope.yaml | set MAXTEXT_COMPAT_MATRIX to an existing file, or reinstall maxtext-compat
    """

    def __init__(self, message: str, *, path: str, key: str = "", **kw: Any) -> None:
        self.path = path
        self.key = key
        where = f"{path}: {key}" if key else path
        super().__init__(message, argument=where, **kw)


class ResolutionError(CompatError, LookupError):
    """No matrix row fits the installed (or given) versions.

    >>> from maxtext_compat import ResolutionError, load_matrix
    >>> try:
    ...     load_matrix().row("9.9")
    ... except ResolutionError as err:
    ...     print(err.argument, err.found)
    release 9.9
    """


class IncompatibleVersionsError(ResolutionError):
    """The matrix marks this combination of versions as incompatible.

    >>> from maxtext_compat import IncompatibleVersionsError, resolve
    >>> try:
    ...     resolve({"maxtext": "0.2.0", "tpu-inference": "0.32.0"})
    ... except IncompatibleVersionsError as err:
    ...     print(err.message)
    maxtext 0.2.0 and tpu-inference 0.32.0 are incompatible (maxtext 0.2.0 needs tpu-inference <0.20.0,>=0.12.0)
    """


class ProbeMismatchError(CompatError, RuntimeError):
    """The installed MaxText behaves differently from its matrix row (strict mode).

    `resolve(strict=True)` raises it when a probe of the installed source disagrees with the row; what it says:

    >>> from maxtext_compat import ProbeMismatchError
    >>> print(ProbeMismatchError("the installed MaxText disagrees with matrix row 0.2.5: returns.attention",
    ...                          fix="fix the row in compat_matrix.yaml"))
    the installed MaxText disagrees with matrix row 0.2.5: returns.attention. Fix: fix the row in compat_matrix.yaml
    """


class InvalidArgumentError(CompatError, ValueError):
    """A caller passed a value we cannot use or translate.

    >>> from maxtext_compat import InvalidArgumentError, resolve
    >>> try:
    ...     resolve({"maxtext": "zero"})
    ... except InvalidArgumentError as err:
    ...     print(err.message, "|", err.expected, "|", err.found)
    not a PEP 440 version | a version such as 0.2.5 | 'zero'
    """


class InvalidArgumentTypeError(CompatError, TypeError):
    """A caller passed a value of the wrong type.

    >>> from maxtext_compat import InvalidArgumentTypeError, load_matrix
    >>> from maxtext_compat.adapters import wrap
    >>> class NotALayer:
    ...     def __call__(self, x):
    ...         return x
    >>> try:
    ...     wrap(NotALayer, row=load_matrix().row("0.2.5"))
    ... except InvalidArgumentTypeError as err:
    ...     print(err.argument, "|", err.fix)
    module | wrap one of those, or pass kind= explicitly
    """


class EnvironmentBuildError(CompatError, RuntimeError):
    """A matrix environment could not be created.

    `maxtext-compat envs build` and `matrix` raise it; an environment that failed to build is reported as such:

    >>> from maxtext_compat import EnvironmentBuildError
    >>> print(EnvironmentBuildError("environment 'maxtext-0.2.5' is not built",
    ...                             fix="run `maxtext-compat envs build maxtext-0.2.5` or `make envs`"))
    environment 'maxtext-0.2.5' is not built. Fix: run `maxtext-compat envs build maxtext-0.2.5` or `make envs`
    """


class UnknownReleaseWarning(UserWarning):
    """An installed release is not in the matrix; the nearest row is used.

    >>> import warnings
    >>> from maxtext_compat import UnknownReleaseWarning, resolve
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     res = resolve({"maxtext": "0.3.0"})
    >>> seen[0].category is UnknownReleaseWarning, res.maxtext.name
    (True, '0.2.5')
    """


class TracedBeforeInstallWarning(UserWarning):
    """A shim profile was installed after JAX compiled functions that may have traced its targets.

    Installing a profile after JAX compiled jitted functions warns with it (`doctor` lists them); to make such
    warnings errors in a test suite:

    >>> import warnings
    >>> from maxtext_compat import TracedBeforeInstallWarning
    >>> warnings.simplefilter("error", TracedBeforeInstallWarning)
    >>> warnings.resetwarnings()
    """


class ProbeMismatchWarning(UserWarning):
    """The installed MaxText disagrees with its matrix row (non-strict mode).

    `resolve()` of the installed versions warns with it when a probe disagrees (strict=True raises instead):

    >>> import warnings
    >>> from maxtext_compat import ProbeMismatchWarning
    >>> issubclass(ProbeMismatchWarning, UserWarning)
    True
    """


class KernelUnavailableError(CompatError, RuntimeError):
    """The attention kernel cannot run as asked here: tpu-inference is missing, its version lacks
    the requested feature, or the kernel needs the CPU shim on a CPU backend.

    >>> from maxtext_compat import KernelUnavailableError
    >>> err = KernelUnavailableError("tpu-inference is not installed", argument="attention_metadata",
    ...                              fix="pip install tpu-inference (the release the matrix row needs)")
    >>> err.argument, isinstance(err, RuntimeError)
    ('attention_metadata', True)
    """


class ShimRefusedError(CompatError, RuntimeError):
    """A shim refused to install: unverified jax, or applied after the code it patches was traced.

    >>> from maxtext_compat import ShimRefusedError
    >>> print(ShimRefusedError("refused: jax 0.6.0 is not verified", argument="jax", fix="pass force=True"))
    [jax] refused: jax 0.6.0 is not verified. Fix: pass force=True
    """


class RequestRefusedError(ShimRefusedError):
    """A served request asks for a feature the serving stack drops or fails on (a known defect of tpu-inference).

    Inside a vLLM server it is also vLLM's `VLLMValidationError`, so the client gets a 400 with vLLM's error
    body naming the parameter (serving_fixes/request_defects.py); catch this class in-process.

    >>> from maxtext_compat import RequestRefusedError, ShimRefusedError
    >>> err = RequestRefusedError("frequency_penalty is ignored by tpu-inference's sampler",
    ...                           argument="frequency_penalty", found=0.5, fix="leave frequency_penalty at 0")
    >>> err.argument, isinstance(err, ShimRefusedError)
    ('frequency_penalty', True)
    """


class CacheCapacityError(InvalidArgumentError):
    """A request needs more KV-cache pages or tokens than the cache (or the padded batch) holds.

    >>> from maxtext_compat import CacheCapacityError
    >>> from maxtext_compat.paged import PageAllocator
    >>> pages = PageAllocator(2, 16)  # 2 pages of 16 tokens
    >>> try:
    ...     pages.allocate("a", 40)
    ... except CacheCapacityError as err:
    ...     print(err.argument)
    num_tokens
    """


class StaleSliceError(InvalidArgumentError):
    """A SequenceSlice (or metadata built from it) outlived its request's pages: the request was freed, or a
    newer step was cut for it. Writing with it would overwrite tokens that now belong to someone else.

    >>> from maxtext_compat import StaleSliceError
    >>> issubclass(StaleSliceError, ValueError)  # an InvalidArgumentError: catch either
    True
    """


class PatchError(CompatError, RuntimeError):
    """A shim could not be installed or removed; nothing was changed unless the message says rollback failed.

    >>> from maxtext_compat import PatchError, shims
    >>> try:
    ...     shims.install("no-such-profile")
    ... except PatchError as err:  # ProfileError, PatchTargetError and PatchConflictError are PatchErrors
    ...     print(type(err).__name__)
    ProfileError
    """


class PatchTargetError(PatchError, LookupError):
    """A patch target cannot be imported, found, read or written.

    >>> from maxtext_compat import PatchTargetError, shims
    >>> shims.register_profile("demo-missing", lambda: [shims.PatchSpec("no_such_pkg.mod:f", lambda o: o.value)])
    >>> try:
    ...     shims.install("demo-missing")
    ... except PatchTargetError as err:
    ...     print(err.argument)
    no_such_pkg.mod
    >>> shims.unregister_profile("demo-missing")
    """


class PatchConflictError(PatchError):
    """A patch target is wrapped or replaced by someone else (at install), or our patch was (at uninstall).

    >>> from maxtext_compat import PatchConflictError, PatchError
    >>> issubclass(PatchConflictError, PatchError)
    True
    """


class ProfileError(PatchError, LookupError):
    """A shim profile is unknown, registered twice, or cannot be built or chosen.

    >>> from maxtext_compat import ProfileError, shims
    >>> try:
    ...     shims.install("no-such-profile")
    ... except ProfileError as err:
    ...     print(err.expected)  # the registered ones: MaxText's own, and any a plugin or a test added
    one of [...'call-rule', ...'known-defects', ...'vllm-backport'...]
    """


class ServingError(CompatError, RuntimeError):
    """Serving a MaxText model through vLLM / tpu-inference cannot proceed as configured.

    >>> from maxtext_compat import ServingError
    >>> print(ServingError("the server exited before it was ready", fix="read its log"))
    the server exited before it was ready. Fix: read its log
    """


class ServingConfigError(ServingError, ValueError):
    """vLLM's configuration (config.json, flags, additional_config) and the MaxText config disagree.

    >>> from maxtext_compat import ServingConfigError, ServingError
    >>> issubclass(ServingConfigError, ServingError) and issubclass(ServingConfigError, ValueError)
    True
    """


class PluginMismatchError(ServingConfigError):
    """A vLLM worker's plugin state (matrix rows, versions, shim profiles, settings) differs from the engine's.

    `host` is the worker's host; `differences` holds (field, engine's value, this process's value):

    >>> from maxtext_compat.errors import PluginMismatchError, ServingConfigError
    >>> err = PluginMismatchError("set up differently", host="w1", differences=[("settings.rpa_kernel", "xla", None)])
    >>> err.host, err.differences[0][0], isinstance(err, ServingConfigError)
    ('w1', 'settings.rpa_kernel', True)
    """

    def __init__(self, message: str, *, host: str, differences: list[tuple[str, Any, Any]], **kw: Any) -> None:
        self.host = host
        self.differences = list(differences)
        super().__init__(message, **kw)


class BackendUnavailableError(ServingError, LookupError):
    """No serving backend can run the installed MaxText release (e.g. the backport is not installed).

    >>> from maxtext_compat import BackendUnavailableError, ServingError
    >>> issubclass(BackendUnavailableError, ServingError)
    True
    """


class WeightsUnavailableError(ServingError):
    """The served model has no weights to load: no checkpoint path and not `--load-format dummy`.

    >>> from maxtext_compat import WeightsUnavailableError
    >>> print(WeightsUnavailableError("no weights to load", fix="pass load_parameters_path, or --load-format dummy"))
    no weights to load. Fix: pass load_parameters_path, or --load-format dummy
    """


class WeightsMismatchError(CompatError, ValueError):
    """A parameter tree does not fit the model it is loaded into: paths missing, extra, or of another shape.

    `missing` / `extra` list paths ('a/b/c'); `mismatched` lists (path, found shape, expected shape).

    >>> from maxtext_compat import WeightsMismatchError
    >>> err = WeightsMismatchError("the checkpoint does not fit the model", missing=["decoder/norm/scale"],
    ...                            mismatched=[("token_embedder/embedding", (256, 64), (256, 128))])
    >>> err.missing, err.mismatched[0][0]
    (['decoder/norm/scale'], 'token_embedder/embedding')
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
    """A call contradicts the declared caller convention (e.g. names kv_cache= under `legacy`).

    >>> from maxtext_compat import ConventionMismatchError
    >>> print(ConventionMismatchError("this call names kv_cache=, the caller convention is declared 'legacy'",
    ...                               argument="kv_cache", fix="declare 'kv_return'"))
    [kv_cache] this call names kv_cache=, the caller convention is declared 'legacy'. Fix: declare 'kv_return'
    """


class BackportError(CompatError, RuntimeError):
    """The backported vLLM path cannot run this call (e.g. a scanned stack).

    >>> from maxtext_compat import BackportError
    >>> issubclass(BackportError, RuntimeError)
    True
    """


class CrossRunError(CompatError, RuntimeError):
    """A run in another environment failed or produced no result.

    >>> from maxtext_compat import CrossRunError
    >>> print(CrossRunError("maxtext-0.2.5 wrote no answer", fix="read build/logs/maxtext-0.2.5.log"))
    maxtext-0.2.5 wrote no answer. Fix: read build/logs/maxtext-0.2.5.log
    """


class OldConventionError(CompatError, RuntimeError):
    """An old-convention call under policy `error`, or past the matrix's `ends_in` release.

    >>> from maxtext_compat import OldConventionError
    >>> print(OldConventionError("old call under policy 'error'", argument="call convention",
    ...                          fix="out, kv_cache = attention(...)"))
    [call convention] old call under policy 'error'. Fix: out, kv_cache = attention(...)
    """


class KVCacheNotUpdatedError(CompatError, RuntimeError):
    """Strict mode: a new call returned no KV cache, or returned it untouched after a step that writes it.

    >>> from maxtext_compat import KVCacheNotUpdatedError
    >>> from maxtext_compat.adapters import strict_mode
    >>> with strict_mode():  # new calls whose layer returns no (or an unchanged) KV cache raise it
    ...     pass
    >>> issubclass(KVCacheNotUpdatedError, RuntimeError)
    True
    """


# --- internal signals (caught inside the package, never raised to a user) ---------------------


class ParamViolation(Exception):
    """What beartype raises for the argument contract (its `violation_param_type`): the contract's wrapper catches
    it and raises InvalidArgumentTypeError naming the argument."""


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
