"""The repository and the matrix it ships, named once for every test file.

Why a module and not only a fixture: tests parametrize over the matrix's rows at collection time,
where fixtures do not reach; `shipped_matrix()` is cached, so the file is read and checked once."""

from __future__ import annotations

import functools
from pathlib import Path

from maxtext_compat.matrix import CompatMatrix, load_matrix

REPO = Path(__file__).resolve().parents[2]
MATRIX_FILE = REPO / "compat_matrix.yaml"


@functools.cache
def shipped_matrix() -> CompatMatrix:
    """The repository's compat_matrix.yaml (not $MAXTEXT_COMPAT_MATRIX, not the wheel's copy)."""
    return load_matrix(MATRIX_FILE)


def lowest_claimed_python() -> str:
    """The Python version pyproject.toml's requires-python starts at (`>=3.11` -> "3.11")."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    claim = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    (floor,) = [s.version for s in SpecifierSet(claim) if s.operator == ">="]
    return floor
