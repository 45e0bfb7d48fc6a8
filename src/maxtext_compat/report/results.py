"""The results of a matrix run: per environment, what passed; written as compat-report.{json,md,html}.

Why apart from the runner: a report is also drawn from results files alone (`maxtext-compat report`, and
`report --merge` joining the results of many machines), with no environment to run.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from maxtext_compat.matrix import CompatMatrix, EnvironmentSpec
from maxtext_compat.report import evidence as report_evidence
from maxtext_compat.report import page as report_page

Status = Literal["ok", "failed", "build-failed", "no-tests", "timeout"]


@dataclass
class EnvResult:
    name: str
    maxtext: str | None
    versions: dict[str, str] = field(default_factory=dict)
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    duration_s: float = 0.0
    status: Status = "ok"
    detail: str = ""
    peak_memory_gb: float = 0.0  # summed memory (PSS) of the run's process tree at its highest
    cold_cache: bool = False  # its JAX compilation cache held nothing when it started (envdurations)
    light_peak_gb: float = 0.0  # the peak before its heavy phase began (0.0: the run had none; envmemory)
    gate_wait_s: float = 0.0  # seconds its test process waited for the heavy phase's gate (not its own work)
    source: str = ""  # `matrix --maxtext`: where its MaxText came from, the row its code resolved as, what refused it

    @property
    def ok(self) -> bool:
        return self.status == "ok"


MOCKED_MAXTEXT = "pytest-mock tests against the matrix (no environment installs it)"
MOCKED_TPU_INFERENCE = "pytest-mock tests of the exact RPA call and metadata for the range (no environment installs it)"


def mocked_rows(m: CompatMatrix) -> list[str]:
    """MaxText releases with no real environment: covered by pytest-mock tests only."""
    real = {e.maxtext for e in m.environments.values() if e.maxtext}
    return [r.name for r in m.maxtext if r.name not in real]


def pinned_version(env: EnvironmentSpec, package: str) -> str | None:
    """The exact version of `package` an environment installs (`name==X`; an override wins over its pins)."""
    return env.pinned(package)


def _pinned(m: CompatMatrix, package: str) -> set[str]:
    """Exact versions of `package` some environment installs."""
    return {v for env in m.environments.values() if (v := pinned_version(env, package)) is not None}


def mocked_tpu_inference_rows(m: CompatMatrix) -> list[str]:
    """tpu-inference ranges no environment installs a version of: covered by pytest-mock tests only."""
    pins = _pinned(m, "tpu-inference")
    return [r.label for r in m.tpu_inference if not any(r.contains(v) for v in pins)]


def why_not_real(m: CompatMatrix, label: str) -> str:
    """The row's own one-line reason no environment installs it (`not_real:` in the matrix)."""
    row = next(r for r in m.tpu_inference if r.label == label)
    return row.not_real or "no reason given (add `not_real:` to the row)"


REPORT_FIELDS = ("name", "versions", "passed", "failed", "skipped", "duration_s", "peak_memory_gb", "errors", "status",
                 "detail", "maxtext", "cold_cache", "source")  # fmt: skip


def write_reports(
    results: Sequence[EnvResult], m: CompatMatrix, out_dir: Path, *, claims: bool = True,
    run: dict[str, object] | None = None, screenshot: bool = True,
) -> None:  # fmt: skip
    """compat-report.json, .md and .html (the grid page, with a screenshot when Chromium is installed).

    `claims`: this repository's run, which also says which rows only mocks cover (a user's run of the pin sets
    makes no such claim); `run`: what identifies the run (report.merge refuses to join different ones)."""
    from maxtext_compat._version import __version__

    data: dict[str, object] = {
        "run": {"matrix": m.fingerprint(), "maxtext_compat": __version__, "claims": claims, **(run or {})},
        "envs": [{k: v for k, v in asdict(r).items() if k in REPORT_FIELDS} for r in results],
        "mocked_rows": [{"maxtext": name, "covered_by": MOCKED_MAXTEXT} for name in mocked_rows(m)] if claims else [],
        "mocked_tpu_inference_rows": [
            {"tpu_inference": rng, "covered_by": MOCKED_TPU_INFERENCE, "why": why_not_real(m, rng)}
            for rng in (mocked_tpu_inference_rows(m) if claims else [])
        ],
    }
    envs_out = typing.cast(list[dict[str, object]], data["envs"])
    for env in envs_out:  # what each proved (a real server, the real kernel, real weights), from its junit file
        junit = out_dir / "junit" / f"{env['name']}.xml"
        env["proofs"], env["real_weights"] = report_evidence.proofs(junit), report_evidence.real_weights(junit)
    (out_dir / "compat-report.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    weights = {str(env["name"]): typing.cast(dict[str, int], env["real_weights"]) for env in envs_out}
    markdown = render_markdown(results, m, claims=claims, real_weights=weights)
    (out_dir / "compat-report.md").write_text(markdown, encoding="utf-8")
    report_page.write(data, m, out_dir, screenshot=screenshot)


def render_table(results: Sequence[EnvResult]) -> str:
    head = (
        f"{'environment':<22} {'maxtext':<8} {'passed':>7} {'failed':>7} {'skipped':>8} {'time':>8} {'peak':>8}  status"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.name:<22} {r.maxtext or '-':<8} {r.passed:>7} {r.failed + r.errors:>7} {r.skipped:>8} "
            f"{r.duration_s:>7.0f}s {r.peak_memory_gb:>6.1f}GB  {r.status}"
        )
    lines += [f"{r.name}: {r.source}" for r in results if r.source]
    return "\n".join(lines)


def render_markdown(
    results: Sequence[EnvResult],
    m: CompatMatrix,
    *,
    claims: bool = True,
    real_weights: dict[str, dict[str, int]] | None = None,
) -> str:
    lines = [
        "# Compat test matrix report",
        "",
        "| environment | maxtext | versions | passed | failed | skipped | time (s) | peak memory (GB) | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        vers = ", ".join(f"{k} {v}" for k, v in sorted(r.versions.items())) or "-"
        lines.append(
            f"| {r.name} | {r.maxtext or '-'} | {vers} | {r.passed} | {r.failed + r.errors} | {r.skipped} | "
            f"{r.duration_s:.0f} | {r.peak_memory_gb:.1f} | {r.status} |"
        )
    own = [f"- {r.name}: {r.source}" for r in results if r.source]
    lines += ["", "## Your own MaxText", "", *own] if own else []
    if real_weights is not None:  # which model families each environment proved with real weights (its junit file)
        lines += ["", "## Model families proven with real weights", ""]
        proven = [(r.name, real_weights.get(r.name) or {}) for r in results]
        lines += [f"- {name}: " + ", ".join(f"{fam} ({n} tests passed)" for fam, n in fams.items())
                  for name, fams in proven if fams]  # fmt: skip
        if not any(fams for _, fams in proven):
            lines.append("None in this run.")
    if not claims:  # a user's run of the pin sets: their tests in each, nothing said about rows it did not run
        return "\n".join(lines) + "\n"
    lines += ["", "## Rows covered only by mocked versions", ""]
    mocked, ranges = mocked_rows(m), mocked_tpu_inference_rows(m)
    lines += [f"- MaxText {name}: {MOCKED_MAXTEXT}" for name in mocked]
    lines += [f"- tpu-inference {r}: {MOCKED_TPU_INFERENCE}; not installed here: {why_not_real(m, r)}" for r in ranges]
    if not mocked and not ranges:  # said, so an empty section is not read as a cut-off list
        lines.append(f"None: each of the {len(m.maxtext)} MaxText rows and {len(m.tpu_inference)} tpu-inference ranges "
                     "is installed by an environment of the matrix.")  # fmt: skip
    return "\n".join(lines) + "\n"


def closing_line(results: Sequence[EnvResult]) -> str:
    passed = sum(r.passed for r in results)
    failed = sum(r.failed + r.errors for r in results) + sum(
        1 for r in results if r.status in ("build-failed", "no-tests")
    )
    skipped = sum(r.skipped for r in results)
    return f"compat-matrix: {passed} passed, {failed} failed, {skipped} skipped"


def main_exit_code(results: Sequence[EnvResult]) -> int:
    return 0 if results and all(r.ok for r in results) else 1
