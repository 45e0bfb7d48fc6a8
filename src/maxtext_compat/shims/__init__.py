"""Reversible monkeypatches that give an installed MaxText the convention a user needs.

The public API is re-exported lazily: `import maxtext_compat.shims` imports neither jax,
MaxText nor wrapt, so the doctor and the vLLM plugin entry point stay cheap.

    from maxtext_compat import shims
    shims.register_profile("my-fix", lambda: [shims.PatchSpec("pkg.mod:Cls.__call__", factory)])
    shims.install("my-fix")          # idempotent, all or nothing (a registered `shims.Shim`: through its install())
    with shims.patched("my-fix"): ...
    shims.uninstall()                # restores every original by identity
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from maxtext_compat._lazy import lazy_face

if TYPE_CHECKING:
    from maxtext_compat.patching import Original, PatchSet, PatchSpec, add_keyword_params
    from maxtext_compat.patching.ledger import ActivePatch, active_patches
    from maxtext_compat.patching.profiles import (
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
    from maxtext_compat.patching.shim import Shim

_EXPORTS = {
    "Original": "patching",
    "PatchSet": "patching",
    "PatchSpec": "patching",
    "add_keyword_params": "patching",
    "Profile": "patching.profiles",
    "active_profiles": "patching.profiles",
    "default_profile": "patching.profiles",
    "has_default_profile_chooser": "patching.profiles",
    "install": "patching.profiles",
    "installed": "patching.profiles",
    "patched": "patching.profiles",
    "register_profile": "patching.profiles",
    "registered_profiles": "patching.profiles",
    "set_default_profile_chooser": "patching.profiles",
    "uninstall": "patching.profiles",
    "unregister_profile": "patching.profiles",
    "verify": "patching.profiles",
    "ActivePatch": "patching.ledger",
    "active_patches": "patching.ledger",
    "Shim": "patching.shim",
}

__all__ = [
    "ActivePatch",
    "Original",
    "PatchSet",
    "PatchSpec",
    "Profile",
    "Shim",
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
    if owner == "patching.profiles" and not _BUILTINS_REGISTERED:
        importlib.import_module(f"{__name__}.maxtext_profiles").register()
        _BUILTINS_REGISTERED = True


# The engine lives in maxtext_compat.patching (it imports no MaxText); this face adds MaxText's profiles.
__getattr__, __dir__ = lazy_face("maxtext_compat", _EXPORTS, face=__name__, before_first=_register_builtins)
