"""`make bench`: run every benchmark in its matrix environment, merge the rows into build/bench.md.

    .envs/dev/bin/python benchmarks/run_all.py [--out build] [--only traced,eager,...]

Why a driver: each figure of issue #7 is a ratio against the native MaxText call *in the same
run*, and the releases live in different virtual environments (their MaxText, jax and flax
differ). So each environment's python runs small scripts (bench_*.py) that print JSON rows
`{figure, env, value, unit, native, ratio, how}`; this driver (stdlib only, any python) merges
them into one markdown table plus issue #3's kernel table (bench_paged.py).

Scheduling, for a 2-core machine: importing MaxText costs 10-30 s per process, so one process
per environment runs several scripts (`--child`). Op counting (no timing) runs two processes
in parallel; everything timed runs alone, one process after the other, so no figure is measured
while another process competes for the cores.

This module is also the scripts' shared helper (`row`, `emit`, `cpu_env`): they import it from
the same directory, and it imports nothing outside the standard library.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "@bench-row "  # MaxText and absl print to stdout too: rows carry a marker
CPU_ENV = {"JAX_PLATFORMS": "cpu", "TPU_NAME": "cpu-test", "TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "cpu"}
# The benchmarks reuse the tests' aids (reference attention, HLO counts, cross-environment runs): tests/helpers.
TESTS_PATH = {
    "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1] / "tests"), os.environ.get("PYTHONPATH")])
    )
}
SECTIONS = ("traced cost", "eager overhead", "import cost", "paged decode", "real model", "served", "memory")


# ----------------------------------------------------------------------------------------------
# Helpers for the bench_*.py scripts
# ----------------------------------------------------------------------------------------------


def cpu_env() -> None:
    """CPU only, and keep tpu-inference from polling GCE metadata (before jax is imported)."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)


def env_name() -> str:
    return os.environ.get("MAXTEXT_COMPAT_ENV") or Path(sys.prefix).name


def row(
    figure: str,
    value: float | None,
    unit: str,
    how: str,
    *,
    native: float | None = None,
    ratio: float | None = None,
    spread: str | None = None,
    ref: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One figure. ratio defaults to value / native; `ref` names another environment's row whose native
    value is this row's native (filled in by the driver: e.g. the backport on 0.1.0 vs 0.2.5's native)."""
    if ratio is None and value is not None and native:
        ratio = value / native
    out = {"figure": figure, "env": env_name(), "value": value, "unit": unit, "native": native, "ratio": ratio}
    out["how"] = how
    if spread:
        out["spread"] = spread
    if ref:
        out["ref"] = ref
    return out


def timings(fn: Callable[[], Any], rounds: int) -> list[float]:
    """Seconds of `rounds` calls of `fn` (warm it first: the first call of a jitted function compiles)."""
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def emit(rows: Iterable[dict[str, Any]]) -> None:
    for r in rows:
        print(MARK + json.dumps(r), flush=True)


def child(modules: list[str]) -> int:
    """Run each bench module's `run()` in this process (imports paid once) and print its rows."""
    sys.path.insert(0, str(HERE))
    failed = 0
    for name in modules:
        start = time.perf_counter()
        try:
            emit(importlib.import_module(name).run())
        except Exception as exc:  # one broken benchmark must not hide the others' numbers
            failed += 1
            traceback.print_exc()
            emit([row(f"{name} failed", None, "", f"{type(exc).__name__}: {exc}"[:300])])
        print(f"[bench] {env_name()} {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    env: str
    modules: tuple[str, ...]
    timed: bool  # timed jobs run alone; the others two at a time


JOBS = (
    Job("maxtext-0.2.5", ("bench_traced",), timed=False),
    Job("maxtext-0.1.0-jax011", ("bench_traced",), timed=False),
    Job("maxtext-0.1.0", ("bench_traced",), timed=False),
    Job("unit", ("bench_eager",), timed=True),  # the adapter's own cost, on pure-Python fake modules
    # bench_import first: it times MaxText's own import in a fresh process as the reference.
    Job(
        "maxtext-0.2.5", ("bench_import", "bench_memory", "bench_eager", "bench_decode", "bench_real_model"), timed=True
    ),
    # Two `vllm serve` processes one after the other (ours, then tpu-inference's own Llama): a process of its own.
    Job("maxtext-0.2.5", ("bench_serving",), timed=True),
    Job("maxtext-0.1.0-jax011", ("bench_eager", "bench_decode"), timed=True),  # decode reads 0.2.5's files
)


def env_python(env: str) -> Path:
    try:
        from maxtext_compat.runner.envs import env_python as find
    except ImportError:
        return ROOT / ".envs" / env / "bin" / "python"
    return find(env)


def run_job(job: Job, work: Path, logs: Path) -> tuple[list[dict[str, Any]], float, int]:
    python = env_python(job.env)
    label = f"{job.env}: {' '.join(job.modules)}"
    if not python.exists():
        return [row(f"{m} skipped", None, "", f"{python} missing (make envs)") for m in job.modules], 0.0, 1
    env = {**os.environ, **CPU_ENV, **TESTS_PATH, "MAXTEXT_COMPAT_ENV": job.env, "BENCH_WORK": str(work)}
    env.pop("XLA_FLAGS", None)  # one CPU device: the tiny models run on one
    print(f"[bench] start {label}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    log = logs / f"{job.env}-{'-'.join(m.removeprefix('bench_') for m in job.modules)}.log"
    with open(log, "w") as err:
        proc = subprocess.run(
            [str(python), str(Path(__file__)), "--child", *job.modules],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT, check=False,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    rows = [json.loads(line[len(MARK) :]) for line in proc.stdout.splitlines() if line.startswith(MARK)]
    for r in rows:
        r["env"] = job.env
    print(f"[bench] done  {label}: {seconds:.0f} s, {len(rows)} rows, exit {proc.returncode}", file=sys.stderr)
    return rows, seconds, proc.returncode


def run_paged(out: Path, logs: Path) -> tuple[str, float]:
    """Issue #3's table, written by bench_paged.py itself."""
    env = "maxtext-0.2.5"
    md = out / "bench-paged.md"
    start = time.perf_counter()
    print(f"[bench] start {env}: bench_paged", file=sys.stderr, flush=True)
    with open(logs / f"{env}-paged.log", "w") as log:
        code = subprocess.run(
            [str(env_python(env)), str(HERE / "bench_paged.py"), "--out", str(md)],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **CPU_ENV, **TESTS_PATH, "MAXTEXT_COMPAT_ENV": env},
            cwd=ROOT, check=False,
        ).returncode  # fmt: skip
    seconds = time.perf_counter() - start
    print(f"[bench] done  {env}: bench_paged: {seconds:.0f} s, exit {code}", file=sys.stderr)
    text = md.read_text(encoding="utf-8") if code == 0 and md.exists() else f"bench_paged.py failed (exit {code})\n"
    return text, seconds


def resolve_refs(rows: list[dict[str, Any]]) -> None:
    """Fill `native`/`ratio` of rows measured against another environment's native call.

    ref = {"env", "figure"[, "overhead": True]}: native = that row's native; ratio = value / native, or
    (native + value) / native for an overhead (extra time per call).
    """
    by_key = {(r["env"], r["figure"]): r for r in rows}
    for r in rows:
        ref = r.get("ref")
        other = by_key.get((ref["env"], ref["figure"])) if ref else None
        if other is None or other.get("native") is None or r.get("value") is None:
            continue
        r["native"] = native = other["native"]
        r["ratio"] = (native + r["value"]) / native if ref.get("overhead") else r["value"] / native


def fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) >= 100):
        return f"{int(x):,}"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| figure | environment | value | ratio vs native | how measured |", "|---|---|---|---|---|"]
    for r in rows:
        value = f"{fmt(r['value'])} {r['unit']}".strip() + (f" ({r['spread']})" if r.get("spread") else "")
        ratio = "—" if r.get("ratio") is None else f"{r['ratio']:.3f}" if r["ratio"] >= 0.01 else f"{r['ratio']:.1e}"
        if r.get("native") is not None:
            ratio += f" (native {fmt(r['native'])})"
        how = str(r["how"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['figure']} | {r['env']} | {value} | {ratio} | {how} |")
    return "\n".join(lines) + "\n"


def section(r: dict[str, Any]) -> int:
    return next((i for i, s in enumerate(SECTIONS) if r["figure"].startswith(s)), len(SECTIONS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build", help="directory of bench.md / bench.json")
    parser.add_argument("--child", nargs="+", metavar="MODULE", help=argparse.SUPPRESS)
    parser.add_argument("--no-paged", action="store_true", help="skip issue #3's kernel table (bench_paged.py)")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)

    start = time.perf_counter()
    out: Path = args.out
    work, logs = out / "bench-work", out / "bench-logs"
    shutil.rmtree(work, ignore_errors=True)  # files passed between environments come from this run only
    for d in (work, logs):
        d.mkdir(parents=True, exist_ok=True)
    results: list[tuple[Job, list[dict[str, Any]], float, int]] = []
    untimed = [j for j in JOBS if not j.timed]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = pool.map(lambda j: run_job(j, work, logs), untimed)
        results += [(job, *result) for job, result in zip(untimed, done, strict=True)]
    for job in (j for j in JOBS if j.timed):
        results.append((job, *run_job(job, work, logs)))
    paged, paged_seconds = ("", 0.0) if args.no_paged else run_paged(out, logs)

    rows = [r for _, rs, _, _ in results for r in rs]
    resolve_refs(rows)
    rows.sort(key=section)  # stable: each section keeps the scripts' order
    total = time.perf_counter() - start
    timing = [f"{j.env} ({', '.join(j.modules)}): {s:.0f} s" for j, _, s, _ in results]
    timing += [] if args.no_paged else [f"maxtext-0.2.5 (bench_paged): {paged_seconds:.0f} s"]
    failed = [f"{j.env} ({', '.join(j.modules)})" for j, _, _, code in results if code]
    text = (
        "# Benchmarks (issue #7)\n\n"
        "Every ratio is against the native MaxText call measured in the same run (`ratio = value / native`; "
        "eager overhead: `(native + extra) / native`). CPU only; timings vary with the machine and its load.\n\n"
        + markdown(rows)
        + f"\nTotal `make bench` time: {total:.0f} s on {os.cpu_count()} cores. Per process: {'; '.join(timing)}.\n"
        + (f"\nFAILED: {', '.join(failed)} (see {logs}).\n" if failed else "")
        + ("\n" + paged.replace("# Paged RPA benchmark", "## Paged RPA kernel (issue #3)", 1) if paged else "")
    )
    (out / "bench.md").write_text(text, encoding="utf-8")
    (out / "bench.json").write_text(
        json.dumps({"rows": rows, "total_seconds": total, "processes": timing}, indent=1), encoding="utf-8"
    )
    print(text)
    print(f"wrote {out / 'bench.md'} and {out / 'bench.json'} in {total:.0f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
