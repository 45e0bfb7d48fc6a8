"""Uniquely named fake packages in sys.modules, for tests that patch MaxText-like code.

Why shared: every shim test must prove that each namespace it patched holds exactly the objects
it held before (by identity) and must leave sys.modules as it found it; only the modules and the
namespaces to watch differ from test to test.
"""

from __future__ import annotations

import sys
import textwrap
import types
import uuid


def make_module(name: str, source: str = "") -> types.ModuleType:
    """A module in sys.modules whose functions report it as their __module__ (like a real import)."""
    mod = types.ModuleType(name)
    if "." not in name:
        mod.__path__ = []  # a package, so submodules resolve
    sys.modules[name] = mod
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), mod.__dict__)
    return mod


class FakePackage:
    """A fake package named `<prefix>_<random>`; subclasses create its modules and list `owners()`."""

    def __init__(self, prefix: str) -> None:
        self.pkg = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.snapshot: list[dict[str, object]] = []

    def owners(self) -> list[object]:
        """The modules and classes whose namespaces must come back unchanged."""
        raise NotImplementedError

    def target(self, path: str) -> str:
        return f"{self.pkg}.layers:{path}"

    def take_snapshot(self) -> list[dict[str, object]]:
        return [dict(vars(o)) for o in self.owners()]

    def assert_pristine(self) -> None:
        """Every namespace holds exactly the objects it held in `snapshot` (by identity), nothing added."""
        for before, owner in zip(self.snapshot, self.owners(), strict=True):
            now = dict(vars(owner))
            assert now.keys() == before.keys(), owner
            assert all(now[k] is before[k] for k in before), owner

    def cleanup(self) -> None:
        for name in [n for n in sys.modules if n.startswith(self.pkg)]:
            del sys.modules[name]
