"""Module paths that moved keep importing (`maxtext_compat._moved`): the table, its page, and the paths the docs showed.

Every row is imported in tests/compat/test_moved_paths.py, where every new module imports (numpy, jax); here, in
the unit environment, the table's consistency and the three paths the docs showed before they moved.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.moved_paths import IMPORTER, import_old_paths
from maxtext_compat._moved import MOVED

pytestmark = pytest.mark.envs("unit")

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "maxtext_compat"


def _exists(dotted: str) -> bool:
    path = PACKAGE.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_new_path_is_a_module_and_no_old_path_is_one():
    """An old path that is a module again would never reach its alias (the finder is asked last): refused here."""
    assert [new for new in MOVED.values() if not _exists(new)] == []
    assert [old for old in MOVED if _exists(old)] == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("maxtext_compat.rpa", "maxtext_compat.kernel.rpa"),
        ("maxtext_compat.shims.cpu_rpa", "maxtext_compat.cpu.rpa"),
        ("maxtext_compat.shims.cpu_serving", "maxtext_compat.cpu.serving"),
    ],
)
def test_a_path_the_docs_showed_imports_as_the_new_module_with_a_warning(old, new):
    got = import_old_paths({old: new})[old]
    assert got["warnings"] == [
        [
            "DeprecationWarning",
            f"{old} moved to {new}; import {new} instead (the old path is a deprecated alias)",
            IMPORTER,  # the warning points at the importing line, not at the import system
        ]
    ]
    assert got["same_module"] and got["names"] > 0 and got["names_identical"]
    assert got["from_import_identical"] and got["parent_attribute_identical"]


def test_a_path_removed_without_a_successor_still_fails_to_import():
    out = subprocess.run(
        [sys.executable, "-c", "import maxtext_compat.serving.server"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 1 and "ModuleNotFoundError: No module named 'maxtext_compat.serving.server'" in out.stderr


def test_import_maxtext_compat_installs_the_finder_once_and_imports_no_new_module():
    script = (
        "import importlib, sys, maxtext_compat\n"
        "importlib.reload(maxtext_compat)\n"
        "from maxtext_compat._moved import MOVED, MovedPathFinder\n"
        "print(sum(isinstance(f, MovedPathFinder) for f in sys.meta_path))\n"
        "print(sorted(n for n in MOVED.values() if 'maxtext_compat.' + n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["1", "[]"]


def drawn_table() -> str:
    """docs/architecture.md's table of moved paths, drawn from MOVED."""
    rows = ["| old path | new path |", "|---|---|"]
    rows += [f"| `maxtext_compat.{old}` | `maxtext_compat.{new}` |" for old, new in MOVED.items()]
    return "\n".join(rows)


def test_the_docs_list_every_moved_path():
    doc = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    assert drawn_table() in doc, f"replace the moved-paths table of docs/architecture.md with:\n{drawn_table()}"
