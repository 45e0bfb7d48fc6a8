"""The lowest Python the package claims is the one a matrix environment runs on, and the tools check for it.

Why: `requires-python` is a promise to every installer. It is only true while an environment of `make test`
runs on that version (`unit`, and tpu-inference-0.25.0 with the real kernel), while ruff and mypy are told to
refuse syntax and APIs newer than it, and while every source file compiles under it (PEP 695's `def f[T]`,
a 3.12 feature, once kept the whole package from importing on 3.11)."""

from __future__ import annotations

import os
import sys
import tomllib

from helpers.shipped import REPO, ci_matrix, lowest_claimed_python

SOURCES = ("src", "tests", "tools", "benchmarks")


def test_the_claimed_python_is_the_lowest_a_matrix_environment_runs():
    versions = {name: e.python for name, e in ci_matrix().environments.items()}
    floor = lowest_claimed_python()
    assert min(versions.values(), key=lambda v: tuple(map(int, v.split(".")))) == floor, versions
    assert versions["unit"] == floor  # the whole unit suite, the CLI and the wheel's install run on it
    # One real-kernel environment on it too (tpu-inference's RPA kernel through the dispatcher, with vllm-tpu).
    kernel = [n for n, e in ci_matrix().environments.items() if e.python == floor and e.tests]
    assert kernel, f"no kernel environment on Python {floor}"


def test_ruff_and_mypy_target_the_claimed_python():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    floor = lowest_claimed_python()
    assert config["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
    assert config["tool"]["mypy"]["python_version"] == floor


def test_every_source_file_compiles_on_this_interpreter():
    """Run in `unit`, this interpreter is the claimed floor; every file of the repository must compile on it."""
    if os.environ.get("MAXTEXT_COMPAT_ENV") == "unit":
        assert f"{sys.version_info.major}.{sys.version_info.minor}" == lowest_claimed_python()
    failures = []
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*.py")):
            try:
                compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
            except SyntaxError as exc:
                failures.append(f"{path.relative_to(REPO)}:{exc.lineno}: {exc.msg}")
    assert not failures, failures
