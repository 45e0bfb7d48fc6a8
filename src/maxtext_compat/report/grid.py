"""The report's grid: one row per MaxText release (and one for the kernel-only environments), one column per
tpu-inference range (and one for none), each environment a chip in its cell labelled by its jax.

Why these states: a reader choosing versions wants to know, per combination, the strongest thing that ran there —
a real `vllm serve`, the real RPA kernel, a real install of the release, only mocks — or why the combination is
refused (the resolver's own message), or that the matrix allows it but nothing here installs the pair.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.errors import CompatError
from maxtext_compat.matrix import CompatMatrix
from maxtext_compat.matrix.types import TpuInferenceRow

# Strongest first: a cell with several environments shows the strongest state any of them reached,
# unless one failed (a failure is never hidden behind another environment's pass).
STATES: dict[str, str] = {
    "failed": "failed: an environment here did not pass",
    "real-serve": "real vllm serve: a server answered requests",
    "real-kernel": "real RPA kernel: tpu-inference's kernel ran (CPU, interpret mode)",
    "real-install": "real install: the suite passed on the installed release (no kernel here)",
    "not-run": "not run: an environment is defined here, no result in this report",
    "mocked": "mocked: pytest-mock tests against the matrix row (nothing installs it)",
    "allowed": "allowed by the matrix; not installed together here",
    "refused": "refused: the resolver rejects this combination",
    "none": "no environment",
}
KERNEL_ONLY = "kernel only"  # the row of environments without MaxText
NO_TPU_INFERENCE = "none"  # the column of environments without tpu-inference


@dataclass(frozen=True)
class EnvChip:
    """One environment in its cell: its result (or None when the report has none) and what it proved."""

    name: str
    jax: str | None
    tpu_inference: str | None
    state: str
    result: Mapping[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "jax": self.jax, "tpu_inference": self.tpu_inference, "state": self.state,
                "result": dict(self.result) if self.result is not None else None}  # fmt: skip


@dataclass
class Cell:
    row: str  # a MaxText release, or KERNEL_ONLY
    column: str  # a tpu-inference range label, or NO_TPU_INFERENCE
    state: str = "none"
    reason: str = ""
    envs: list[EnvChip] = field(default_factory=list)


@dataclass(frozen=True)
class Grid:
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    column_releases: Mapping[str, tuple[str, ...]]
    conventions: Mapping[str, str]
    cells: Mapping[tuple[str, str], Cell]

    def cell(self, row: str, column: str) -> Cell:
        return self.cells[(row, column)]


def env_state(result: Mapping[str, Any] | None, maxtext: str | None) -> str:
    """What one environment proved: its status and the proofs counted from its junit file."""
    if result is None or result.get("status") in (None, "not-run"):
        return "not-run"
    if result.get("status") != "ok":
        return "failed"
    proofs = result.get("proofs") or {}
    if proofs.get("serve"):
        return "real-serve"
    if proofs.get("kernel"):
        return "real-kernel"
    return "real-install" if maxtext else "not-run"


def _column_of(m: CompatMatrix, version: str | None) -> str:
    if version is None:
        return NO_TPU_INFERENCE
    row = m.tpu_inference_row(version)
    return row.label if row is not None else NO_TPU_INFERENCE


def _first_release(t: TpuInferenceRow) -> str:
    return next(iter(t.releases))


def refusal(m: CompatMatrix, maxtext: str, t: TpuInferenceRow) -> str:
    """The resolver's message for MaxText `maxtext` with the first release of range `t`, or "" if it allows it."""
    from maxtext_compat.resolution.resolver import resolve

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            resolve({"maxtext": maxtext, "tpu-inference": _first_release(t)}, matrix=m, probe=False)
        except CompatError as exc:
            return str(exc)
    return ""


def build_grid(data: Mapping[str, Any], m: CompatMatrix) -> Grid:
    """The grid for a report's results (`data`, as compat-report.json holds them) and the matrix."""
    results = {e["name"]: e for e in data.get("envs", ())}
    releases = sorted(m.maxtext, key=lambda r: r.release, reverse=True)
    rows = (*(r.name for r in releases), KERNEL_ONLY)
    columns = (*(t.label for t in reversed(m.tpu_inference)), NO_TPU_INFERENCE)  # newest first, as the rows
    cells = {(r, c): Cell(r, c) for r in rows for c in columns}
    for env in m.environments.values():
        tpi = env.pinned("tpu-inference")
        if env.maxtext is None and tpi is None:
            continue  # the unit environment: in the table of environments, not in the grid
        row = env.maxtext if env.maxtext is not None else KERNEL_ONLY
        result = results.get(env.name)
        chip = EnvChip(env.name, env.pinned("jax"), tpi, env_state(result, env.maxtext), result)
        cells[(row, _column_of(m, tpi))].envs.append(chip)
    mocked = set(data.get("mocked_rows_names", ())) | {r["maxtext"] for r in data.get("mocked_rows", ())}
    order = list(STATES)
    for cell in cells.values():
        if cell.envs:
            states = [c.state for c in cell.envs]
            cell.state = "failed" if "failed" in states else min(states, key=order.index)
            cell.envs.sort(key=lambda c: (c.jax or "", c.name))
            continue
        if cell.row == KERNEL_ONLY or cell.column == NO_TPU_INFERENCE:
            continue
        t = next(t for t in m.tpu_inference if t.label == cell.column)
        cell.reason = refusal(m, cell.row, t)
        if cell.reason:
            cell.state = "refused"
        else:
            cell.state = "mocked" if cell.row in mocked else "allowed"
    return Grid(
        rows=rows,
        columns=columns,
        column_releases={t.label: tuple(t.releases) for t in m.tpu_inference} | {NO_TPU_INFERENCE: ()},
        conventions={r.name: r.convention for r in releases},
        cells=cells,
    )


def planned_results(m: CompatMatrix, durations: Mapping[str, float], names: Sequence[str] | None = None) -> dict:
    """A results document with no run behind it: every environment `not-run`, with its recorded duration."""
    envs = [
        {"name": n, "maxtext": m.environments[n].maxtext, "status": "not-run", "duration_s": durations.get(n, 0.0)}
        for n in (names or m.environments)
    ]
    return {"envs": envs, "mocked_rows": [], "mocked_tpu_inference_rows": [], "planned": True}
