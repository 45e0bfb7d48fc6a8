"""What the demo proved in each environment, from its `--json` document, and the summary of a run over several.

Why from the document: the demo's text is for people and may change; its JSON result (`maxtext-compat demo
--json`) names each section's outcome, so the summary reads the same fields the compat tests assert
(tests/compat/test_demo.py) instead of parsing the rendered lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The demo's exit codes (demo.run): 0 both paths agree, 1 they differ, 2 it cannot run here.
WHY = {1: "the paged and dense paths, or a real model and transformers, differ", 2: "it cannot run here"}
COLUMNS = ("environment", "MaxText", "path", "old call", "new call", "paged decode = dense", "real model", "Gemma 3",
           "seconds")  # fmt: skip


@dataclass
class DemoRun:
    """The demo in one environment: its exit code (None: it never ran or was stopped), its JSON document, why it
    failed, where its output is, and its time (the environment's build included) and memory."""

    name: str
    code: int | None
    data: dict[str, Any] | None = None
    error: str = ""
    log: str = ""
    seconds: float = 0.0
    demo_seconds: float = 0.0  # the demo's own process, without the build (what the schedule records)
    peak_gb: float = 0.0
    note: str = ""  # the demo's last line: where its third-party output went
    build_s: float = 0.0  # seconds its environment took to build (0: it was up to date)

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.data is not None

    @property
    def failure(self) -> str:
        """Why this run failed ("" when it did not)."""
        if self.ok:
            return ""
        if self.error:
            return self.error
        if self.code in WHY:
            return f"exit {self.code}: {WHY[self.code]}"
        return "it wrote no JSON result" if self.code == 0 else f"exit {self.code}"


def proved(data: dict[str, Any]) -> dict[str, str]:
    """The summary's cells for one demo document: the release and path, then each claim (`yes`, `NO`, or why it
    was not shown there)."""
    s = data.get("summary", {})
    calls = data.get("calls", {})
    new = calls.get("new_call", {})
    serving = data.get("serving", {})
    real = data.get("real_model")
    return {
        "MaxText": str(s.get("maxtext_row") or "-"),
        "path": str(s.get("path") or "-"),
        "old call": "yes" if "shape" in calls.get("old_call", {}) else "NO",
        "new call": "yes" if "hidden" in new else "not here" if "unavailable" in new else "NO",
        "paged decode = dense": _claim(serving, "all_tokens_match"),
        "real model": _claim(real, "equal_to_reference", says="= transformers"),
        "Gemma 3": _claim(data.get("gemma3"), "equal_to_reference", says="= transformers"),
    }


def _claim(section: dict[str, Any] | None, key: str, says: str = "yes") -> str:
    if not section or "unavailable" in section:
        return "left out" if section and "left out" in section["unavailable"] else "not here"
    return says if section.get(key) else "NO"


def table(runs: Sequence[DemoRun]) -> str:
    """One row per environment: what it proved (or why it failed) and its wall time."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for run in runs:
        if run.data is not None and run.code in (0, 1):
            cells = [run.name, *proved(run.data).values()]
        else:
            cells = [run.name, f"FAILED: {run.failure} ({run.log})" if run.log else f"FAILED: {run.failure}"]
            cells += [""] * (len(COLUMNS) - 2)
        lines.append("| " + " | ".join([*cells, f"{run.seconds:.0f}"]) + " |")
    return "\n".join(lines)


def closing(runs: Sequence[DemoRun], wall_s: float, jobs: int) -> str:
    """The last line: the total wall time and which environments failed, by name."""
    minutes, seconds = divmod(round(wall_s), 60)
    head = f"demo: {len(runs)} environments in {minutes}:{seconds:02d} ({jobs} at most at once)"
    failed = [r.name for r in runs if not r.ok]
    if not failed:
        return f"{head}; all passed"
    return f"{head}; FAILED in {len(failed)}: {', '.join(failed)}"


def exit_code(runs: Sequence[DemoRun]) -> int:
    """0 when the demo ran and both paths agreed in every environment (and there was one), else 1."""
    return 0 if runs and all(r.ok for r in runs) else 1
