"""The caller convention: which return shape the code calling a MaxText module expects.

Why declared and not guessed: code written after MaxText PR #2616 does `out, _ = attention(x, ...)`
on every call, with or without KV arguments; code written before does `out = attention(x, ...)`.
A call without KV arguments looks the same from both, so only a declaration tells them apart
(`auto` falls back to the per-call rule: naming kv_cache/attention_metadata is a new call).

Where a declaration comes from, most specific first: `wrap(module, convention=...)`, a
`with caller_convention(...)` block, the process (`set_caller_convention` or
`shims.install(..., convention=...)`), `$MAXTEXT_COMPAT_CONVENTION`, the matrix row's `callers:`.
MaxText's own code always gets the installed release's behaviour and ours the per-call rule: their
calls are written for them, so a user's declaration never reaches inside the model.
"""

from __future__ import annotations

import contextvars
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from maxtext_compat.contract import checked
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import CALLER_CONVENTIONS, MaxTextRow

ENV = "MAXTEXT_COMPAT_CONVENTION"
AUTO, LEGACY, KV_RETURN = CALLER_CONVENTIONS
NATIVE = "native"  # not declarable: what MaxText's own calls get (the release's behaviour, unchanged)


@dataclass(frozen=True)
class Declared:
    """A caller convention and where it was declared (doctor and error messages show both)."""

    value: str
    source: str


_scope: contextvars.ContextVar[Declared | None] = contextvars.ContextVar("maxtext_compat_caller", default=None)
_lock = fork_safe_lock()
_process: list[Declared] = []  # at most one: the process-wide declaration in code


def check(value: object, argument: str) -> str:
    """`value` if it names a caller convention, else a typed error naming `argument`."""
    if isinstance(value, str) and value in CALLER_CONVENTIONS:
        return value
    raise InvalidArgumentError(
        f"{argument} is not a caller convention",
        argument=argument,
        expected=f"one of {', '.join(CALLER_CONVENTIONS)}",
        found=repr(value),
        fix="use 'kv_return' for code that unpacks (out, kv_cache) on every call, 'legacy' for code written "
        "before MaxText PR #2616, or 'auto' to decide per call by whether kv_cache= is passed",
    )


@checked
def set_caller_convention(value: str | None, *, source: str = "set_caller_convention()") -> Declared | None:
    """Declare the convention of this process's calling code (None removes it); returns the previous one.

    >>> from maxtext_compat.adapters import set_caller_convention
    >>> set_caller_convention("kv_return")  # nothing declared before
    >>> set_caller_convention(None).value  # removed again; the previous declaration comes back
    'kv_return'
    """
    declared = None if value is None else Declared(check(value, "convention"), source)
    with _lock:
        previous = _process[0] if _process else None
        _process[:] = [] if declared is None else [declared]
    return previous


def process_convention() -> Declared | None:
    process = _process[:1]  # one read (a concurrent set_caller_convention swaps the list's contents)
    return process[0] if process else None


@contextmanager
@checked
def caller_convention(value: str) -> Iterator[Declared]:
    """Declare the caller convention for the calls made inside the block (this thread/task only).

    >>> from maxtext_compat.adapters import caller_convention
    >>> with caller_convention("legacy") as declared:  # calls in here get the old returns, KV arguments refused
    ...     print(declared.value, "|", declared.source)
    legacy | caller_convention() block
    """
    declared = Declared(check(value, "convention"), "caller_convention() block")
    token = _scope.set(declared)
    try:
        yield declared
    finally:
        _scope.reset(token)


def from_environment() -> Declared | None:
    raw = os.environ.get(ENV)
    if not raw:
        return None
    return _cached(("env", raw), lambda: Declared(check(raw, ENV), f"${ENV}"))


def row_declaration(row: MaxTextRow) -> Declared:
    """The matrix row's default (its `callers:`), where it comes from included."""
    return Declared(row.callers, f"compat_matrix.yaml row {row.name} (callers:)")


_DEFAULT = Declared(AUTO, "default")
# The one precedence outside a wrap(), most specific first; the matrix row's `callers:` (or the default) ends it.
_SOURCES: tuple[Callable[[], Declared | None], ...] = (_scope.get, process_convention, from_environment)


def layers(row: MaxTextRow | None) -> list[Declared]:
    """Every declaration that applies outside a wrap(), most specific first, ending with the default."""
    out = [d for d in (source() for source in _SOURCES) if d is not None]
    out.append(_DEFAULT if row is None else row_declaration(row))
    return out


def declared(row: MaxTextRow | None, module_value: str | None = None, row_default: Declared | None = None) -> Declared:
    """The convention in force for a call from user code on `row` (module_value: wrap(convention=)): the
    wrap()'s, else `layers(row)[0]` without building the others. row_default: `row_declaration(row)`, made once
    by the call site (every adapter call asks)."""
    if module_value is not None:
        return _cached(("wrap", module_value), lambda: Declared(module_value, "wrap(convention=)"))
    for source in _SOURCES:
        found = source()
        if found is not None:
            return found
    if row is None:
        return _DEFAULT
    return row_default if row_default is not None else row_declaration(row)


_DECLARED: dict[tuple[str, ...], Declared] = {}


def _cached(key: tuple[str, ...], make: Callable[[], Declared]) -> Declared:
    """One Declared per value and source (immutable), made on first use; an invalid one is never cached."""
    found = _DECLARED.get(key)
    if found is None:
        found = _DECLARED.setdefault(key, make())
    return found


_BY_MAXTEXT = Declared(NATIVE, "a call made by MaxText itself")
_BY_US = Declared(AUTO, "a call made by maxtext-compat itself")

# The module a call site (an adapter or a rule shim) is running natively right now: (id of the module, whether
# the code that runs is MaxText's). Set around every native call, so whatever that code calls is known to be
# MaxText's own call without looking at the stack, and a rule shim met on the way for the same module (under an
# adapter, or under another profile's wrapper) passes the call through: the rule is applied once.
NATIVE_CALL: contextvars.ContextVar[tuple[int, bool] | None] = contextvars.ContextVar(
    "maxtext_compat_native_call", default=None
)


def call_owner(cls: type) -> type | None:
    """The class along `cls`'s MRO whose dict defines `__call__` (the entry `inspect.getattr_static` reads)."""
    for klass in cls.__mro__:
        if "__call__" in klass.__dict__:
            return klass
    return None


def maxtext_code(cls: type) -> bool:
    """Whether calling `cls` runs MaxText's code: the class that defines its `__call__` is MaxText's."""
    owner = call_owner(cls)
    return owner is not None and owner.__module__.partition(".")[0] in _MAXTEXT


def for_call(row: MaxTextRow, module_value: str | None = None, row_default: Declared | None = None) -> Declared:
    """The convention for the call being made now.

    MaxText's own calls get NATIVE: a call that names no KV argument runs exactly as the release
    runs it (whatever it returns); one that does follows the per-call rule, so its KV writes are
    checked. Calls made by maxtext-compat itself (serving, test helpers) follow the per-call rule.
    A call made while a call site runs MaxText's code natively is MaxText's (NATIVE_CALL); only the
    outermost call looks at its caller's frames (MaxText's own engines, its vLLM adapter and decode
    scripts call the model with no patched MaxText code around them).
    row_default: `row_declaration(row)`, made once by the call site (every adapter call asks).
    """
    running = NATIVE_CALL.get()
    if running is not None and running[1]:
        return _BY_MAXTEXT
    caller = _caller_library()
    if caller == "maxtext":
        return _BY_MAXTEXT
    if caller == "ours":
        return _BY_US
    return declared(row, module_value, row_default)


# Frames of the call machinery between the caller and the module: skipped when looking for the caller.
_MACHINERY = ("maxtext_compat.adapters", "maxtext_compat.shims", "maxtext_compat.patching", "maxtext_compat.convention")
_PLUMBING = ("flax", "jax", "jaxlib", "wrapt", "contextlib", "functools")
_MAXTEXT = ("MaxText", "maxtext")


_SKIP = "skip"  # a frame of the machinery or of flax/jax: look further out
# A code object belongs to one module: classified once, by identity (equal code objects of two modules, e.g. the
# same one-line lambda, compare equal), the object kept so its id is not reused.
_KIND_OF_CODE: dict[int, tuple[types.CodeType, str | None]] = {}


def _classify(frame: types.FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    top = name.partition(".")[0]
    if name.startswith(_MACHINERY) or top in _PLUMBING:
        return _SKIP
    return "maxtext" if top in _MAXTEXT else "ours" if top == "maxtext_compat" else None


def _caller_library() -> str | None:
    """'maxtext' or 'ours' when the first frame outside the call machinery and flax/jax is MaxText's or
    ours; None for any other code (the user's, tpu-inference's, vLLM's)."""
    frame: types.FrameType | None = sys._getframe(1)
    kinds = _KIND_OF_CODE
    while frame is not None:
        code = frame.f_code
        known = kinds.get(id(code))
        if known is not None and known[0] is code:
            kind = known[1]
        else:
            kind = _classify(frame)
            if len(kinds) > 4096:  # code objects of exec'd or generated functions: keep the cache bounded
                kinds.clear()
            kinds[id(code)] = (code, kind)
        if kind is not _SKIP:
            return kind
        frame = frame.f_back
    return None
