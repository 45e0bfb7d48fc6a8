"""Every old module path in `maxtext_compat._moved.MOVED` imports as its new module, with a DeprecationWarning naming
the new path: here, where every new module imports (numpy, jax; tests/unit/test_moved_paths.py checks the table)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.moved_paths import IMPORTER, import_old_paths
from maxtext_compat._moved import MOVED, MovedPackage

pytestmark = pytest.mark.envs("maxtext-0.2.5")


def test_every_old_path_imports_as_its_new_module():
    moved = {f"maxtext_compat.{old}": f"maxtext_compat.{new}" for old, new in MOVED.items()}
    report = import_old_paths(moved)
    wrong = {}
    for old, new in moved.items():
        got = report[old]
        expected = [
            [
                "DeprecationWarning",
                f"{old} moved to {new}; import {new} instead (the old path is a deprecated alias)",
                IMPORTER,
            ]
        ]
        if got["warnings"] != expected or not (
            got["names"]
            and got["names_identical"]
            and got["from_import_identical"]
            and got["parent_attribute_identical"]
        ):
            wrong[old] = got
    assert wrong == {}
    # a module's alias is the module itself; a package's is a MovedPackage over it (see the next test)
    packages = {old for old in moved if any(k.startswith(old.removeprefix("maxtext_compat.") + ".") for k in MOVED)}
    assert {old for old, got in report.items() if not got["same_module"]} == packages


def test_an_old_package_keeps_its_old_submodules_and_passes_everything_else_to_the_new_one():
    """`import maxtext_compat.engine.compare` sets `compare` on the old package, so `decode.compare` stays the
    function; a name set on the old package (a test's monkeypatch) is set on the new one."""
    script = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import maxtext_compat.engine.compare as old_compare, maxtext_compat.decode as decode\n"
        "import maxtext_compat.engine as engine\n"
        "assert callable(decode.compare) and not isinstance(decode.compare, type(decode)), decode.compare\n"
        "assert engine.compare is old_compare and old_compare is sys.modules['maxtext_compat.decode.comparison']\n"
        "engine.dense_greedy = marker = object()\n"
        "assert decode.dense_greedy is marker\n"
        "print(type(engine).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", "import sys\n" + script], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [MovedPackage.__name__]
