"""The patching core every shim uses: resolve, check, swap and restore a set of targets, all or nothing.

Why not `wrapt.wrap_function_wrapper` alone: a shim must be idempotent, atomic over many
targets, exactly reversible (including `from x import f` aliases held elsewhere), must refuse
to silently wrap a target someone else already patched, and must advertise the parameters
it adds (tpu-inference validates models with `inspect.signature`). wrapt supplies the
wrapper objects (`FunctionWrapper`, `with_signature`); this package supplies the transaction.

Rules:
- Targets are `"module.path:function"` or `"module.path:Class.attr"`; class attributes are
  read from the class dicts along the MRO (like `wrapt.resolve_path`), so the saved original
  is the raw descriptor (function, staticmethod, classmethod) and restore is exact. Patching
  an inherited attribute creates a slot on the named class; restore deletes that slot.
- Install resolves and checks every target first, then swaps all under `LOCK`; a failing
  write rolls back every earlier write. Uninstall checks every location first, then restores.
- Our own wrappers may be stacked (several profiles on one target) and removed in any
  order: a layer with others on top is spliced out beneath them. A wrapper we did not
  install is a `PatchConflictError` unless `stack=True`.
- A marker `__maxtext_compat_patches__` (attribute -> profiles, innermost first) is kept on
  every patched module or class, ddtrace style: visible to anyone, and inherited by `fork`; each wrapper's type
  has a `__maxtext_compat_wrapper__` property naming its profile, so another copy of the library (a second
  install, a reload) recognises our wrappers where its registry does not (`wrapper_profile`).
- Target modules are imported (`import_modules`) before the lock is taken; resolution under
  the lock only reads sys.modules.
- Re-installing the same spec over the same original reuses its wrappers, so a factory runs
  once per (spec, original, profile) and an install/uninstall cycle stays ~20 us per target.

Modules (one job each): `spec` (what a shim declares), `targets` (resolve a target along
the MRO), `conflicts` (refuse foreign patches), `aliases` (the alias sweep), `wrappers`
(our wrapt objects and their cache), `writes` (the only slot mutations, with rollback),
`settings` (values a profile sets: attributes, mapping entries, env vars, globals), `transaction`
(apply/remove, callables and values together), `state` (LOCK, installed layers and their descriptions).
"""

from maxtext_compat.patching.settings import Setting
from maxtext_compat.patching.spec import Original, PatchSpec, add_keyword_params
from maxtext_compat.patching.state import (
    LOCK,
    MARKER,
    WRAPPER_MARKER,
    InstalledLayer,
    installed_layers,
    layer_of,
    original_beneath,
    wrapper_profile,
)
from maxtext_compat.patching.targets import import_modules
from maxtext_compat.patching.transaction import PatchSet, apply, check_removable, drift, remove

__all__ = [
    "LOCK",
    "MARKER",
    "WRAPPER_MARKER",
    "InstalledLayer",
    "Original",
    "PatchSet",
    "PatchSpec",
    "Setting",
    "add_keyword_params",
    "apply",
    "check_removable",
    "drift",
    "import_modules",
    "installed_layers",
    "layer_of",
    "original_beneath",
    "remove",
    "wrapper_profile",
]
