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
        "tests/compat/test_backport_serving.py",
    ),
    "kernel": (
        "tests/compat/test_paged_rpa.py",
        "tests/compat/test_cpu_rpa_shim.py",
        "tests/compat/test_paged_stateful.py",
    ),
}
PROOF_KINDS = tuple(PROOF_FILES)


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def proofs(junit: Path) -> dict[str, int]:
    """Passed tests per proof kind in one junit file ({} when the file is missing or unreadable)."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return {}
    counts = dict.fromkeys(PROOF_KINDS, 0)
    modules = {kind: tuple(_module(p) for p in paths) for kind, paths in PROOF_FILES.items()}
    for case in root.iter("testcase"):
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            continue
        name = case.get("classname", "")
        for kind, mods in modules.items():
            if any(name == m or name.startswith(m + ".") for m in mods):
                counts[kind] += 1
    return counts
