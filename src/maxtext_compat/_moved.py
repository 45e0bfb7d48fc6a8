"""Module paths that moved keep importing: each old path is the module now at its new path, with a warning.

Why a finder and not a file per old path: the old paths are many and spread over packages that have since
changed jobs; one table names them all (docs/architecture.md lists it), and no alias file sits in the tree
where a reader would take it for a module with a job. Importing an old path emits a `DeprecationWarning`
naming the new one and hands out the new module itself (`sys.modules` alias): its names are the very same
objects, and `from old import name` works. An old *package* path is a `MovedPackage` instead, whose reads and
writes go to the new package: importing an old submodule under it sets the old name on it, not on the new
package (`engine.compare` would otherwise shadow `decode.compare`, the function). `import maxtext_compat`
installs the finder (a dict and two classes; nothing is imported until an old path is).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import ModuleType

TYPE_CHECKING = False  # not typing's: this module is part of `import maxtext_compat` (see errors.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# old path -> new path (both under maxtext_compat.). A path removed without a successor in the package (the test
# aids moved to tests/helpers, the rule-shim flag) is not here: importing it fails as before.
MOVED: dict[str, str] = {
    # the kernel's dispatch moved under kernel/
    "rpa": "kernel.rpa",
    "rpa_xla": "kernel.rpa_xla",
    "shims.rpa_mesh_limits": "kernel.mesh_limits",
    # the CPU stand-ins for TPU-only pieces moved out of shims/ into cpu/
    "shims.cpu_rpa": "cpu.rpa",
    "shims.cpu_serving": "cpu.serving",
    "shims.cpu_kernel": "cpu.kernel_choice",
    "shims.pallas_interpreter": "cpu.pallas_interpreter",
    "shims.pallas_interpret_hbm": "cpu.pallas_hbm",
    "shims.pallas_interpret_views": "cpu.pallas_views",
    # the serving stack's request fixes moved out of shims/ into serving_fixes/
    "shims.output_head": "serving_fixes.output_head",
    "shims.seeded_sampling": "serving_fixes.seeded_sampling",
    "shims.serving_requests": "serving_fixes.request_defects",
    # the patching engine moved from shims/ to its own package
    "shims.patching": "patching",
    "shims.patching.aliases": "patching.aliases",
    "shims.patching.conflicts": "patching.conflicts",
    "shims.patching.layers": "patching.transaction",
    "shims.patching.settings": "patching.settings",
    "shims.patching.spec": "patching.spec",
    "shims.patching.state": "patching.state",
    "shims.patching.targets": "patching.targets",
    "shims.patching.transaction": "patching.transaction",
    "shims.patching.wrappers": "patching.wrappers",
    "shims.patching.writes": "patching.writes",
    "shims.profiles": "patching.profiles",
    "shims.registry": "patching.ledger",
    "shims.traced": "patching.traced",
    # the call rule's pieces moved from adapters/ into convention/
    "adapters.policy": "convention.policy",
    "adapters.returns": "convention.returns",
    "adapters.signature": "convention.signature",
    "adapters.translate": "convention.translate",
    "convention.declared": "convention.callers",
    "convention.new_call": "backport.write_path",
    # the 0.1.0 backport: its hooks are a shim, its serving backend sits in serving/, weights at the root
    "backport.hooks": "shims.backport_hooks",
    "backport.serving": "serving.backport_backend",
    "backport.serving_mesh": "serving.backport_mesh",
    "backport.serving_params": "serving.backport_params",
    "backport.weights": "serving.param_trees",
    "serving.backport": "serving.backport_backend",
    "serving.legacy_backend": "serving.backport_backend",
    "serving.legacy_mesh": "serving.backport_mesh",
    "serving.legacy_params": "serving.backport_params",
    "convention.backport": "backport",
    "convention.backport.attention": "backport.attention",
    "convention.backport.call": "backport.call",
    "convention.backport.hooks": "shims.backport_hooks",
    "convention.backport.session": "backport.session",
    # the decode loops: engine/ became decode/
    "engine": "decode",
    "engine.compare": "decode.comparison",
    "engine.dense": "decode.dense",
    "engine.paged": "decode.paged",
    "engine.timing": "decode.timing",
    "engine.types": "decode.types",
    "serving.reference": "decode.greedy",
    # the pytest plugin's state and the matrix runner
    "testing.plugin_state": "pytest_plugin.state",
    "testmatrix": "runner.running",
    # the package's root keeps foundations only: the matrix runner into runner/
    "env_runner": "runner.running",
    "envs": "runner.envs",
    "envmemory": "runner.memory",
    "envdurations": "runner.durations",
    "pinsets": "runner.pinsets",
    "workspace": "runner.workspace",
    "selfwheel": "runner.selfwheel",
    "nox": "runner.nox",
    # which row is installed, into resolution/ (not resolve/: that is the public function maxtext_compat.resolve)
    "resolver": "resolution.resolver",
    "installed": "resolution.installed",
    "installed_kernel": "resolution.installed_kernel",
    "probes": "resolution.probes",
    "defects": "resolution.defects",
    # the demo's modules into demo/ (demo.py became demo/__init__.py: its path is unchanged)
    "demo_all": "demo.every_env",
    "demo_outcome": "demo.outcome",
    "progress": "demo.progress",
    # the serving entry points beside serving/
    "serve_cli": "serve.command",
    "vllm_plugin": "serve.vllm_plugin",
    # strays to their packages (the parameter trees beside their first user, serving: convert/ imports serving/)
    "write_path": "backport.write_path",
    "weights": "serving.param_trees",
    "xla_flags": "serving.xla_flags",
}
PACKAGE = "maxtext_compat"


class MovedPathFinder:
    """Finds `maxtext_compat.<old>` for each old path in MOVED (and nothing else) and loads it as the new module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix, _, old = fullname.partition(".")
        if prefix != PACKAGE or old not in MOVED:
            return None
        package = any(k.startswith(old + ".") for k in MOVED)
        # A loader by protocol: importlib.abc.Loader as a base would import importlib.resources into every process.
        return importlib.machinery.ModuleSpec(fullname, self, is_package=package)  # type: ignore[arg-type]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The module at the new path itself: the import system keeps its __name__ and __spec__ (they are set).
        # Warned after the new module imported (a failed import raises, not warns); stacklevel 2 points past the
        # import system's own frames (the warnings module skips them) at the import statement.
        new = new_path(spec.name)
        module = importlib.import_module(new)
        warnings.warn(
            f"{spec.name} moved to {new}; import {new} instead (the old path is a deprecated alias)",
            DeprecationWarning,
            stacklevel=2,
        )
        return MovedPackage(spec.name, module) if spec.submodule_search_locations is not None else module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module ran when it was imported."""


class MovedPackage(ModuleType):
    """An old package path: every name reads from and writes to the new package, except the old submodules
    imported under it (the import system sets each on its parent), which stay here."""

    def __init__(self, name: str, target: ModuleType) -> None:
        super().__init__(name, target.__doc__)
        ModuleType.__setattr__(self, "__moved_to__", target)
        ModuleType.__setattr__(self, "__path__", [])  # a package whose submodules only the finder finds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__moved_to__, name)

    def __setattr__(self, name: str, value: Any) -> None:
        ModuleType.__setattr__(self, name, value) if self._here(name) else setattr(self.__moved_to__, name, value)

    def __delattr__(self, name: str) -> None:
        ModuleType.__delattr__(self, name) if self._here(name) else delattr(self.__moved_to__, name)

    def __dir__(self) -> list[str]:
        return sorted({*dir(self.__moved_to__), *vars(self)})

    def _here(self, name: str) -> bool:
        """Module attributes (__spec__, __loader__, ...) and the old submodules' names are the alias's own."""
        return name.startswith("__") or f"{self.__name__.removeprefix(PACKAGE + '.')}.{name}" in MOVED


def new_path(old: str) -> str:
    """`maxtext_compat.<new>` for `maxtext_compat.<old>` (the full dotted names)."""
    return f"{PACKAGE}.{MOVED[old.removeprefix(PACKAGE + '.')]}"


def install() -> None:
    """Put the finder last on sys.meta_path, once: asked only for a name no other finder found, it never hides a
    real module (tests/unit/test_moved_paths.py also refuses an old path that is a module again)."""
    if not any(isinstance(f, MovedPathFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedPathFinder())
