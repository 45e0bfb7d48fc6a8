"""Whether a MaxText class already carries a rule shim, and how an adapter runs that shim.

Why in the adapters: when the `vllm-backport` or `call-rule` profile patched the class an adapter
subclasses, the shim already applies the call rule, and applying it a second time would reduce an old
call twice (the second `out[0]` takes batch row 0). Asking that needs the patching engine's ledger,
which the call rule (below the engine) cannot import; the adapter sits above both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maxtext_compat import names
from maxtext_compat.patching import layer_of

_MISSING = object()


def is_rule_wrapper(raw: Any) -> Any:
    """Our installed layer when `raw`, a class-dict entry, applies the call rule (its wrapper function carries the
    marker); else None.

    Decided from the object, not from the registry, so an uninstall racing with the call cannot
    make the adapter call a bare MaxText method with kv_cache= (the layer still holds the wrapper).
    """
    layer = layer_of(raw)
    return layer if layer is not None and getattr(layer.function, names.CALL_RULE_MARKER, False) else None


class RuleShimOf:
    """`is_rule_wrapper` of a class's `__call__` entry, asked on every adapter call and answered again only when
    the entry changed (a shim installed or removed): the answer depends on that object alone."""

    __slots__ = ("cls", "decide", "seen")

    def __init__(self, cls: type, decide: Callable[[Any], Any] = is_rule_wrapper) -> None:
        self.cls, self.decide = cls, decide  # decide: is_rule_wrapper, asked only when the entry changes
        self.seen: tuple[Any, Any] = (_MISSING, None)  # (the entry last seen, its shim), replaced as one

    def __call__(self) -> Any:
        raw = _MISSING
        for klass in self.cls.__mro__:  # the raw entry, as inspect.getattr_static finds it, at a dict lookup's cost
            raw = klass.__dict__.get("__call__", _MISSING)
            if raw is not _MISSING:
                break
        seen, shim = self.seen
        if raw is not seen:
            shim = self.decide(raw)
            self.seen = (raw, shim)
        return shim


def call_rule_wrapper(layer: Any, module: Any, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the shim's rule wrapper itself, whether or not its profile is still installed.

    Why not call the installed object: it runs the original once its profile is removed (so copies
    taken while installed stop patching), and an uninstall racing with this call must not turn a new
    call the adapter already handed to the shim into a bare MaxText call with kv_cache=.
    """
    return layer.function(layer.shim.__wrapped__.__get__(module, cls), module, args, kwargs)
