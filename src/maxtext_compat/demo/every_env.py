"""`maxtext-compat demo --all` (what `make demo` runs): the demo in every environment that shows it, at once where
the machine's cores and memory allow.

Why not a loop over the environments: it built all the test matrix's environments first and ran one demo after
another while a core idled (14 min on a 2-core machine from a fresh clone). Here only the environments the demo
runs in are built, each just before its demo (one build at a time: they share uv's cache), next to the demos
already running; the environments start longest first, each when its recorded peak memory fits
(`runner.memory.run_admitted`, the test matrix's scheduler); each demo keeps its compiled programs in its environment's
persistent JAX cache (`runner.caches.compile_cache_env`, the one its test runs use), so a second run skips the
compiles. The console gets a line when an environment starts and ends, each environment's section whole and in
the matrix's order (the demo's `--json` result, rendered as the demo renders it), and a table of what each
proved; a demo's own stderr (its progress, a traceback) goes to build/logs/demo-ENV.log, and what third-party
libraries print goes to the demo's log in the temporary folder, as always.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from maxtext_compat.demo import LOG_NOTE, render
from maxtext_compat.demo.outcome import DemoRun, closing, exit_code, proved, table
from maxtext_compat.errors import EnvironmentBuildError, InvalidArgumentError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import CompatMatrix
from maxtext_compat.runner import durations as envdurations
from maxtext_compat.runner import envs
from maxtext_compat.runner.memory import PeakSampler, record_peaks, recorded_peaks, run_admitted
from maxtext_compat.runner.running import (
    ENV_NAME_VAR,
    bytecode_cache_env,
    cache_is_cold,
    compile_cache_env,
    expected_durations,
    schedule,
)
from maxtext_compat.runner.workspace import Workspace

DEMO_TEST = "tests/compat/test_demo.py"
# Beside the test matrix's records (tests/ in this checkout): each demo's seconds and peak memory (GB, PSS).
DURATIONS_NAME, MEMORY_NAME = "demo_durations.json", "demo_memory.json"
TIMEOUT_S = 1800.0  # one demo takes 1 to 2 minutes; a hang ends as a failure instead of stalling the rest


def check_options(*, every: bool, verbose: bool, jobs: int | None, record: bool) -> None:
    """The CLI's options for `demo`: --jobs and --record-durations go with --all, --verbose without it."""
    if every and verbose:
        raise InvalidArgumentError(
            "--verbose shows one demo's third-party output on the console; with --all, demos run at once",
            argument="--verbose",
            fix="drop --verbose (each environment's output is in build/logs/demo-ENV.log and the log it names), "
            "or run one environment's demo: .envs/ENV/bin/maxtext-compat demo --verbose",
        )
    if not every and (jobs is not None or record):
        raise InvalidArgumentError(
            "--jobs and --record-durations go with --all (the demo in every environment)",
            argument="--jobs" if jobs is not None else "--record-durations",
            fix="add --all, or drop them to run the demo in this interpreter",
        )


def demo_environments(m: CompatMatrix) -> list[str]:
    """The environments the demo runs in, in the matrix's order: those with MaxText where the suite runs the demo's
    test (the whole suite, or a list naming it). The full sets, which run MaxText's trainer only, would repeat
    their release's demo."""
    return [n for n, spec in m.environments.items() if spec.maxtext and (not spec.tests or DEMO_TEST in spec.tests)]


def demo_command(python: Path | str, *, steps: int, real: bool) -> list[str]:
    """The demo as one environment runs it: its JSON result on stdout, third-party output to its log."""
    return [str(python), "-m", "maxtext_compat.cli", "demo", "--json", "--steps", str(steps),
            *([] if real else ["--no-real-model"])]  # fmt: skip


def run_child(name: str, cmd: Sequence[str], env: dict[str, str], log: Path, *, cwd: Path | None = None,
              timeout: float = TIMEOUT_S) -> DemoRun:  # fmt: skip
    """Run one demo process: its JSON result from stdout; its stderr (progress, the note naming its third-party
    log, a traceback) appended to `log`; its process tree's peak memory sampled."""
    run = DemoRun(name, code=None, log=str(log))
    t0 = time.monotonic()
    with log.open("a", encoding="utf-8") as err:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, text=True)  # fmt: skip
        with PeakSampler(proc.pid) as sampler:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                run.error = f"stopped after {timeout:g} s"
            except BaseException:
                proc.kill()
                proc.wait()
                raise
    run.peak_gb, run.demo_seconds = round(sampler.peak_gb, 1), time.monotonic() - t0
    if not run.error:
        run.code, run.data, run.note = proc.returncode, _document(out), _note(log)
    return run


def _document(out: str) -> dict[str, Any] | None:
    try:
        data = json.loads(out)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _note(log: Path) -> str:
    """The demo's last line, where it says where third-party output went ("" when it did not get that far)."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines[-1] if lines and LOG_NOTE in lines[-1] else ""


def run_in_env(name: str, *, ws: Workspace, steps: int, real: bool, build_lock: Any, logs: Path) -> DemoRun:
    """Build `name` if it is not up to date (under `build_lock`), then run the demo in it with its compilation
    and bytecode caches."""
    spec = ws.matrix.environment(name)
    log = logs / f"demo-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    t0 = time.monotonic()
    build_s = 0.0
    try:
        with build_lock:  # one build at a time (they share uv's cache); the demos already started go on
            t1, current = time.monotonic(), envs.status(spec, ws).up_to_date
            envs.build(spec, log=lines.append, ws=ws)
            build_s = 0.0 if current else time.monotonic() - t1
    except EnvironmentBuildError as exc:
        lines.append(str(exc))
        first = str(exc).splitlines()[0]
        return DemoRun(name, None, error=f"its environment did not build: {first}", log=str(log),
                       seconds=time.monotonic() - t0)  # fmt: skip
    finally:
        log.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    env = {**ws.spec_env(spec), ENV_NAME_VAR: name, **compile_cache_env(name, ws.matrix), **bytecode_cache_env()}
    for key in ("VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"):
        env.pop(key, None)
    run = run_child(name, demo_command(envs.env_python(name, ws), steps=steps, real=real), env, log, cwd=ws.project)
    run.build_s, run.seconds = build_s, time.monotonic() - t0
    return run


def section(run: DemoRun) -> str:
    """What the console shows for one environment: the demo's own rendering of its result, or why it failed."""
    body = ""
    if run.data is not None and run.code in (0, 1):
        try:
            body = render(run.data)
        except (KeyError, TypeError, IndexError):  # a document of another shape: the table still tells
            body = ""
    lines = [body or f"== maxtext-compat demo in {run.name}: FAILED ({run.failure})"]
    if run.note:
        lines.append(run.note)
    if not run.ok:
        lines.append(f"   {run.name}: {run.failure}; its output: {run.log}")
    return "\n" + "\n".join(lines)


def finished_line(run: DemoRun) -> str:
    built = f" (its environment built in {run.build_s:.0f} s)" if run.build_s else ""
    if run.ok:
        return f"[demo] {run.name}: ok in {run.seconds:.0f} s{built}"
    return f"[demo] {run.name}: FAILED in {run.seconds:.0f} s{built}: {run.failure}; its output: {run.log}"


def run_all(
    names: Sequence[str],
    work: Callable[[str], DemoRun],
    *,
    jobs: int,
    order: Sequence[str],
    peaks: dict[str, float],
    sections: TextIO | None,
    progress: TextIO,
    budget_gb: float | None = None,
) -> list[DemoRun]:
    """`work(name)` for every name as `run_admitted` starts them (in `order`, `jobs` at most, memory allowing); a
    line on `progress` as each starts and ends; each one's `section` on `sections` as soon as every name before it
    in `names` has been shown (so the order is the same whichever finishes first). Returns the runs in `names`'
    order; a `work` that raises is a failed run, and the others go on."""
    lock = fork_safe_lock()
    waiting: dict[str, str] = {}
    shown = 0

    def say(line: str) -> None:
        with lock:
            progress.write(line + "\n")
            progress.flush()

    def show(name: str, text: str) -> None:
        nonlocal shown
        with lock:
            waiting[name] = text
            while shown < len(names) and names[shown] in waiting:
                if sections is not None:
                    sections.write(waiting.pop(names[shown]) + "\n")
                    sections.flush()
                shown += 1

    def one(name: str) -> DemoRun:
        say(f"[demo] {name}: started")
        t0 = time.monotonic()
        try:
            run = work(name)
        except Exception as exc:  # an environment that cannot be built, an OS error: that one fails, not the rest
            first = str(exc).splitlines()[0] if str(exc) else ""
            run = DemoRun(name, None, error=f"{type(exc).__name__}: {first}", seconds=time.monotonic() - t0)
        say(finished_line(run))
        show(name, section(run))
        return run

    done = run_admitted(order, peaks, jobs, one, budget_gb)
    return [done[n] for n in names]


def records(ws: Workspace) -> tuple[Path | None, Path | None]:
    """The files of the demo's recorded seconds and peaks (none in a workspace without records)."""
    return (None, None) if ws.records is None else (ws.records / DURATIONS_NAME, ws.records / MEMORY_NAME)


def main(ws: Workspace, *, steps: int = 16, real: bool = True, jobs: int | None = None, as_json: bool = False,
         record: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:  # fmt: skip
    """The demo in every environment of `demo_environments`; prints the sections (or with `as_json` one JSON
    document), the summary table and the total wall time; returns 0 when every environment passed."""
    out, err = out if out is not None else sys.stdout, err if err is not None else sys.stderr
    jobs = jobs if jobs is not None else max(1, os.cpu_count() or 1)
    names = demo_environments(ws.matrix)
    seconds_file, peaks_file = records(ws)
    # Read before any demo runs: a demo writes into the cache it shares with the environments of its jaxlib.
    cold = {n for n in names if cache_is_cold(n, ws.matrix)}
    order = schedule(names, expected_durations(seconds_file, matrix=ws.matrix) if seconds_file is not None else {})
    peaks = recorded_peaks(peaks_file) if peaks_file is not None else {}
    err.write(f"[demo] {len(names)} environments, {jobs} at most at once, longest first: {' '.join(order)}\n")
    work = functools.partial(run_in_env, ws=ws, steps=steps, real=real, build_lock=fork_safe_lock(),
                             logs=ws.state / "logs")  # fmt: skip
    t0 = time.monotonic()
    runs = run_all(names, work, jobs=jobs, order=order, peaks=peaks, sections=None if as_json else out, progress=err)
    wall = time.monotonic() - t0
    if as_json:  # stdout holds the document alone
        out.write(json.dumps(as_document(runs, wall, jobs), indent=2) + "\n")
        err.write(closing(runs, wall, jobs) + "\n")
    else:
        out.write(f"\n{table(runs)}\n{closing(runs, wall, jobs)}\n")
    if record and seconds_file is not None and peaks_file is not None:
        ok = [r for r in runs if r.ok]
        envdurations.write(seconds_file, {r.name: r.demo_seconds for r in ok}, cold=cold & {r.name for r in ok})
        record_peaks({r.name: r.peak_gb for r in ok if r.peak_gb > 0}, peaks_file)
        err.write(f"[demo] seconds and peaks recorded in {seconds_file} and {peaks_file}\n")
    return exit_code(runs)


def as_document(runs: Sequence[DemoRun], wall_s: float, jobs: int) -> dict[str, Any]:
    """`demo --all --json`: every environment's result document beside what it proved, its times and memory."""
    return {
        "wall_s": round(wall_s, 1),
        "jobs": jobs,
        "ok": exit_code(runs) == 0,
        "environments": [
            {
                "name": r.name,
                "ok": r.ok,
                "exit_code": r.code,
                "failure": r.failure,
                "proved": proved(r.data) if r.data is not None and r.code in (0, 1) else None,
                "seconds": round(r.seconds, 1),
                "build_seconds": round(r.build_s, 1),
                "peak_memory_gb": r.peak_gb,
                "log": r.log,
                "result": r.data,
            }
            for r in runs
        ],
    }
