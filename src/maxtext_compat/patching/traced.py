"""Jitted functions compiled before a profile was installed: they keep running the unpatched code.

Why a warning and not a guarantee: a function JAX traced before the install holds compiled
code and never calls Python again, so nothing a patch does can reach it, and nothing of ours
ran during that trace to say which classes it used. What can be known is which jitted
functions outside JAX and Flax already hold compiled code; the user can then install first,
or call `jax.clear_caches()` so they retrace with the patch.
"""

from __future__ import annotations

import gc
import sys

from maxtext_compat.errors import TracedBeforeInstallWarning, warn_at_call_site
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.patching.registry import REGISTRY

_INTERNAL = ("jax", "jaxlib", "flax", "optax", "numpy")
_lock = fork_safe_lock()


def compiled_functions() -> tuple[str, ...]:
    """`module.qualname` of every jitted function outside JAX/Flax holding compiled code (jax not imported: none),
    the user's before this package's."""
    jax = sys.modules.get("jax")
    if jax is None:
        return ()
    probe = jax.jit(_identity)  # the C++ jitted-function type, whatever jaxlib module holds it
    kind = type(probe)
    found = []
    for obj in gc.get_referrers(kind):
        if type(obj) is not kind or obj is probe:
            continue
        module = getattr(obj, "__module__", None) or "?"
        if module.partition(".")[0] in _INTERNAL:
            continue
        try:
            compiled = obj._cache_size() > 0
        except Exception:  # a jaxlib without the method: say nothing rather than guess
            return ()
        if compiled:
            found.append(f"{module}.{getattr(obj, '__qualname__', '?')}")
    # The user's functions first (what the warning shows of a long list), this package's own after them.
    return tuple(sorted(set(found), key=lambda name: (name.startswith("maxtext_compat."), name)))


def _identity(x: object) -> object:
    return x


def note_install(profile: str, targets: tuple[str, ...]) -> None:
    """Warn when jitted functions were compiled before `profile` first patched `targets` in this process.

    The first install only: the scan walks the garbage collector's referrers (30-50 ms with MaxText
    imported), and a profile installed and removed in a loop would pay it every time.
    """
    with _lock:
        first = profile not in REGISTRY.scanned
        REGISTRY.scanned.add(profile)
    before = compiled_functions() if targets and first else ()
    if not before:
        return
    with _lock:
        REGISTRY.compiled_before[profile] = before
    shown = ", ".join(before[:5]) + (f" and {len(before) - 5} more" if len(before) > 5 else "")
    warn_at_call_site(  # the user's line: the frames between (the API's argument checks among them) vary
        f"maxtext-compat profile {profile!r} was installed after JAX compiled {len(before)} jitted function(s) "
        f"({shown}); any of them that traced {', '.join(targets[:3]) or 'a patched target'} keeps running "
        "the unpatched code. Install the shim before tracing (e.g. through the vLLM or pytest plugin), "
        "or call jax.clear_caches() after installing so they retrace.",
        TracedBeforeInstallWarning,
    )


def note_uninstall(profile: str) -> None:
    with _lock:
        REGISTRY.compiled_before.pop(profile, None)


def compiled_before(profile: str) -> tuple[str, ...]:
    """The jitted functions that were compiled before `profile` was installed (doctor shows them)."""
    with _lock:
        return REGISTRY.compiled_before.get(profile, ())
