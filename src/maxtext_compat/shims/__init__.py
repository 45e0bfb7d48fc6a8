"""Reversible monkeypatches that give an installed MaxText the convention a user needs.

The public API is re-exported lazily: `import maxtext_compat.shims` imports neither jax,
MaxText nor wrapt, so the doctor and the vLLM plugin entry point stay cheap.

    from maxtext_compat import shims
    shims.register_profile("my-fix", lambda: [shims.PatchSpec("pkg.mod:Cls.__call__", factory)])
    shims.install("my-fix")          # idempotent, all or nothing
    with shims.patched("my-fix"): ...
    shims.uninstall()                # restores every original by identity
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from maxtext_compat._lazy import lazy_face

if TYPE_CHECKING:
    from maxtext_compat.shims.patching import Original, PatchSet, PatchSpec, add_keyword_params
    from maxtext_compat.shims.profiles import (
        Profile,
        active_profiles,
        default_profile,
        has_default_profile_chooser,
        install,
        installed,
        patched,
        register_profile,
        registered_profiles,
        set_default_profile_chooser,
        uninstall,
        unregister_profile,
        verify,
    )
    from maxtext_compat.shims.registry import ActivePatch, active_patches

_EXPORTS = {
    "Original": "patching",
    "PatchSet": "patching",
    "PatchSpec": "patching",
    "add_keyword_params": "patching",
    "Profile": "profiles",
    "active_profiles": "profiles",
    "default_profile": "profiles",
    "has_default_profile_chooser": "profiles",
    "install": "profiles",
    "installed": "profiles",
    "patched": "profiles",
    "register_profile": "profiles",
    "registered_profiles": "profiles",
    "set_default_profile_chooser": "profiles",
    "uninstall": "profiles",
    "unregister_profile": "profiles",
    "verify": "profiles",
    "ActivePatch": "registry",
    "active_patches": "registry",
}

__all__ = [
    "ActivePatch",
    "Original",
    "PatchSet",
    "PatchSpec",
    "Profile",
    "active_patches",
    "active_profiles",
    "add_keyword_params",
    "default_profile",
    "has_default_profile_chooser",
    "install",
    "installed",
    "patched",
    "register_profile",
    "registered_profiles",
    "set_default_profile_chooser",
    "uninstall",
    "unregister_profile",
    "verify",
]


_BUILTINS_REGISTERED = False


def _register_builtins(owner: str) -> None:
    """MaxText's own profiles (vllm-backport, known-defects) and the matrix-driven default choice, once per
    process, the first time the profile API is reached (a user who clears the chooser later keeps it cleared)."""
    global _BUILTINS_REGISTERED
    if owner == "profiles" and not _BUILTINS_REGISTERED:
        importlib.import_module(f"{__name__}.maxtext_profiles").register()
        _BUILTINS_REGISTERED = True


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, before_first=_register_builtins)
