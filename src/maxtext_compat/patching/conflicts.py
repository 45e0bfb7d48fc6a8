"""Refusing to wrap what someone else patched, and two targets of one profile writing one slot."""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from maxtext_compat.errors import PatchConflictError, PatchError
from maxtext_compat.patching.registry import REGISTRY
from maxtext_compat.patching.spec import Original, PatchSpec
from maxtext_compat.patching.state import MARKER, Layer, describe_object, is_proxy, label_of, wrapper_profile
from maxtext_compat.patching.writes import read_slot


def _home_module(holder: Any) -> str | None:
    if isinstance(holder, types.ModuleType):
        return holder.__name__
    mod = vars(holder).get("__module__") if isinstance(holder, type) else None
    return mod if isinstance(mod, str) else None


def _foreign(original: Original) -> str | None:
    """Describe the wrapper someone else put at the target, or None if it looks original (or is ours).

    Detected: a wrapper of maxtext-compat this copy did not install (its marker); a wrapt proxy we did not
    install; a Python function (or `__wrapped__`-carrying wrapper) whose `__module__` is not the module that owns
    the slot, i.e. defined elsewhere
    and assigned here (a plain re-export, `from a import f`, is not a patch); a marker saying
    maxtext-compat patched it when this copy did not.
    Not detectable: wrappers that copy `__module__` with functools.wraps (like Flax's own).
    """
    raw = original.raw
    layer = REGISTRY.layers.get(id(raw))
    if layer is not None and layer.wrapper is raw:
        return None
    fn: Any = original.function
    for obj in (raw, fn):
        if wrapper_profile(obj) is not None:  # ours, but not this copy's: describe_object names its profile
            return (
                f"{describe_object(obj)} (another copy of the library in this process, or a wrapper taken while "
                "installed and written back after its uninstall)"
            )
        if is_proxy(obj):
            kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
            return f"{kind} (a wrapt wrapper) around {describe_object(obj.__wrapped__)}"
    marker = read_slot(original.owner, MARKER)
    if isinstance(marker, dict) and original.attribute in marker:
        return (
            f"{describe_object(raw)}, which maxtext-compat's marker lists as patched by "
            f"{list(marker[original.attribute])} "
            "although this copy of maxtext-compat did not install it (imported twice, reloaded, or replaced since)"
        )
    home = _home_module(original.defined_in)
    defined = getattr(fn, "__module__", None) if inspect.isfunction(fn) or _has_wrapped(fn) else None
    if home is not None and isinstance(defined, str) and defined != home and not _reexported(fn, original):
        return f"{describe_object(fn)}, defined in {defined!r} rather than {home!r}"
    return None


def _reexported(fn: Any, original: Original) -> bool:
    """`from a import f` in the target module: f is still a's own f under the same name, not a patch."""
    home = sys.modules.get(getattr(fn, "__module__", None) or "")
    name = getattr(fn, "__qualname__", None)
    return (
        isinstance(original.owner, types.ModuleType)
        and name == original.attribute
        and home is not None
        and read_slot(home, name) is original.raw
    )


def _has_wrapped(obj: Any) -> bool:
    try:
        return hasattr(obj, "__wrapped__")
    except Exception:  # an exotic __getattr__: it is not a functools-style wrapper we can judge
        return False


def raise_same_slot(profile: str, first: Layer, second: Layer, obj: Any, name: str) -> None:
    twice = first.owner is second.owner and first.attribute == second.attribute
    raise PatchError(
        f"profile {profile!r} patches {second.target} twice" if twice else
        f"two targets of profile {profile!r} write the same slot {label_of(obj, name)}",
        argument=profile,
        expected="each module/class slot patched once per profile",
        found=f"{first.target} and {second.target}" + ("" if twice else " (an alias sweep reaches the other)"),
        fix="merge the wrappers into one spec or put them in two profiles (they stack), or narrow `aliases`",
    )  # fmt: skip


def check_conflicts(planned: list[tuple[PatchSpec, Original]]) -> None:
    for spec, original in planned:
        foreign = _foreign(original)
        if foreign is not None:
            raise PatchConflictError(
                f"{spec.target} is already wrapped or replaced by someone else",
                argument=spec.target,
                expected=f"the original defined in {_home_module(original.defined_in)!r}, or a maxtext-compat layer",
                found=foreign,
                fix="remove the other patch first, or install(..., stack=True) to wrap on top of it "
                "(uninstall then restores the other patcher's object)",
            )
