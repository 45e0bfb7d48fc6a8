"""The repository and the matrix it ships, named once for every test file.

Why a module and not only a fixture: tests parametrize over the matrix's rows at collection time,
where fixtures do not reach; `shipped_matrix()` is cached, so the file is read and checked once."""

from __future__ import annotations

import functools
from pathlib import Path

from maxtext_compat.matrix import CompatMatrix, load_matrix, with_environments

REPO = Path(__file__).resolve().parents[2]
MATRIX_FILE = REPO / "compat_matrix.yaml"
CI_LAYOUT = REPO / "tests" / "environments.yaml"


@functools.cache
def shipped_matrix() -> CompatMatrix:
    """The repository's compat_matrix.yaml (not $MAXTEXT_COMPAT_MATRIX, not the wheel's copy): rows and pin sets."""
    return load_matrix(MATRIX_FILE)


@functools.cache
def ci_matrix() -> CompatMatrix:
    """The shipped matrix with this repository's CI environments (tests/environments.yaml)."""
    return with_environments(shipped_matrix(), CI_LAYOUT)


def combined_doc() -> dict:
    """compat_matrix.yaml and tests/environments.yaml as one YAML document (parse_matrix reads both sections), for
    tests that mutate an environment's entry and parse the result."""
    import yaml

    doc = yaml.safe_load(MATRIX_FILE.read_text(encoding="utf-8"))
    doc["environments"] = yaml.safe_load(CI_LAYOUT.read_text(encoding="utf-8"))["environments"]
    return doc


def lowest_claimed_python() -> str:
    """The Python version pyproject.toml's requires-python starts at (`>=3.11` -> "3.11")."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    claim = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    (floor,) = [s.version for s in SpecifierSet(claim) if s.operator == ">="]
    return floor
