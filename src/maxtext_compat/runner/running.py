"""Run a workspace's tests inside each of its environments and report env x passed/failed/skipped.

Why our own runner (nox sessions exist too: maxtext_compat.runner.nox): the environments are the pin sets
of compat_matrix.yaml, built by `envs.build` from uv's cache and reused across runs, the report must
count skips separately from passes and treat an environment that fails to build, or runs no test,
as failed, and a run can be split into shards that machines run apart (`shard`, report.merge).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path

from maxtext_compat.errors import EnvironmentBuildError, InvalidArgumentError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import CompatMatrix
from maxtext_compat.report.results import EnvResult, closing_line, main_exit_code, render_table, write_reports
from maxtext_compat.runner import durations as envdurations
from maxtext_compat.runner import envs, workspace

# The cache paths live in runner.caches; those not used here are imported too, so the old path of this module
# (maxtext_compat.env_runner, a deprecated alias) still hands out every name it had.
from maxtext_compat.runner.caches import (  # noqa: F401
    COMPILE_CACHE_MAX_BYTES,
    COMPILE_CACHE_VAR,
    HF_REFERENCE,
    PARTNER_ANSWERS,
    PRUNED_CACHES,
    PYCACHE,
    UNUSED_CACHE_MAX_AGE_S,
    bytecode_cache_env,
    cache_base,
    cache_is_cold,
    compile_cache_dir,
    compile_cache_env,
    compile_cache_folder,
    hf_reference_dir,
    partner_answers_dir,
    prune_unused_caches,
)
from maxtext_compat.runner.memory import (
    GATE_VAR,
    HEAVY_MARK_SUFFIX,
    MARK_VAR,
    MEMORY_FILE,
    PeakSampler,
    gate_lock,
    gate_waited,
    gated,
    heavy_mark,
    light_memory_file,
    record_peaks,
    recorded_peaks,
    run_admitted,
)
from maxtext_compat.runner.workspace import Workspace

ENV_NAME_VAR = "MAXTEXT_COMPAT_ENV"
# Seconds each environment's suite took on the reference 2-core machine, cold and warm (envdurations): the longest
# start first, so workers finish together (the same idea as pytest-split's committed .test_durations file).
DURATIONS_FILE = "tests/env_durations.json"
TIMEOUT_VAR = "MAXTEXT_COMPAT_ENV_TIMEOUT"
EXTENDED_VAR = "MAXTEXT_COMPAT_EXTENDED"  # 1: a plain run takes the environments marked `extended: true` too
# Generous: the recorded times come from one machine, and a slower or busier one must not read as a hang.
TIMEOUT_FACTOR, MIN_TIMEOUT_S, DEFAULT_TIMEOUT_S = 4.0, 1800.0, 3600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: beyond it a value is a typo (inf would mean no timeout at all)


def _versions_in(python: Path) -> dict[str, str]:
    code = (
        "import json\nfrom maxtext_compat.versions import installed_versions\n"
        "print(json.dumps({k: d.describe() for k, d in installed_versions().items()}))"
    )
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def parse_junit(path: Path) -> tuple[int, int, int, int, float]:
    """(passed, failed, errors, skipped, seconds) from a pytest junit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failures = errors = skipped = 0
    seconds = 0.0
    for s in suites:
        tests += int(s.get("tests", 0))
        failures += int(s.get("failures", 0))
        errors += int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
        seconds += float(s.get("time", 0.0))
    return tests - failures - errors - skipped, failures, errors, skipped, seconds


def run_env(
    name: str,
    *,
    matrix: CompatMatrix,
    pytest_args: Sequence[str] = (),
    build: bool = True,
    report_dir: Path,
    log: Callable[[str], None] = print,
    output: Path | None = None,
    build_lock: contextlib.AbstractContextManager[object] | None = None,
    ws: Workspace | None = None,
    cold_cache: bool | None = None,
    gate: Path | None = None,
) -> EnvResult:
    """Run pytest in one environment; its output goes to `output` (a log file) when given.

    `gate`: the lock file its test process takes for its heavy phase (envmemory: the run's shared one when the
    environment is gated, else one of its own); the start of that phase is marked beside it, which splits the
    run's peak memory into its light peak and its peak.

    `cold_cache`: whether its compilation cache was empty when the run that starts it began (run_matrix looks
    before any environment runs: a partner process of another environment may write into this one's cache
    first); by default, whether it is empty now.

    `build_lock` serialises the build step when environments run at once (they share uv's cache and the
    envs folder); the tests themselves run outside it.
    """
    ws = ws if ws is not None else workspace.default()
    spec = matrix.environment(name)
    res = EnvResult(name=name, maxtext=spec.maxtext)
    t0 = time.monotonic()
    try:
        with build_lock if build_lock is not None else contextlib.nullcontext():
            st = envs.build(spec, log=log, ws=ws) if build else envs.status(spec, ws)
        if not st.built:
            raise EnvironmentBuildError(
                f"environment {name!r} is not built",
                fix=f"run `maxtext-compat envs build {name}` or `make envs`",
            )
    except EnvironmentBuildError as exc:
        res.status, res.detail = "build-failed", str(exc)
        res.duration_s = round(time.monotonic() - t0, 1)
        log(f"[matrix] {name}: BUILD FAILED\n{exc}")
        return res
    python = envs.env_python(name, ws)
    res.versions = _versions_in(python)
    if ws.maxtext_source is not None:
        from maxtext_compat.doctor import own_maxtext_in

        res.source = own_maxtext_in(python, ws.maxtext_source)
    junit = report_dir / "junit" / f"{name}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    if junit.exists():
        junit.unlink()
    env = ws.spec_env(spec)
    env[ENV_NAME_VAR] = name
    env.pop("VIRTUAL_ENV", None)
    env.update(compile_cache_env(name, matrix))
    env.update(bytecode_cache_env())
    res.cold_cache = cache_is_cold(name, matrix) if cold_cache is None else cold_cache
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    mark = None
    if gate is not None:
        mark = heavy_mark(gate.parent, name)  # run_matrix removed an earlier run's marks before any started
        env[GATE_VAR], env[MARK_VAR] = str(gate), str(mark)
    # An environment that lists its test files runs only those (a kernel-only one has no MaxText to test).
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *pytest_args, *spec.tests]
    log(f"[matrix] {name}: {' '.join(cmd[1:])}" + (f" > {output}" if output else ""))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
    limit = env_timeout(name, longest_durations(ws.durations_file))
    with output.open("w", encoding="utf-8") if output else contextlib.nullcontext() as fh:
        # Its own process group: a hung run is stopped with everything it started (vllm servers, partners).
        proc = subprocess.Popen(
            cmd, cwd=ws.project, env=env, stdout=fh, stderr=subprocess.STDOUT if fh else None,
            start_new_session=True,
        )  # fmt: skip
        try:
            with PeakSampler(proc.pid, heavy_mark=mark) as sampler:
                try:
                    proc.wait(timeout=limit)
                finally:
                    res.peak_memory_gb = round(sampler.peak_gb, 1)
                    waited = None if gate is None else gate_waited(gate.parent, name)
                    if waited is not None:
                        res.light_peak_gb, res.gate_wait_s = round(sampler.light_peak_gb, 1), waited
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            res.duration_s = round(time.monotonic() - t0, 1)
            res.status, res.errors = "timeout", 1
            res.detail = f"pytest ran past {limit:.0f} s and was stopped with every process it started ({TIMEOUT_VAR})"
            log(f"[matrix] {name}: TIMEOUT after {limit:.0f} s")
            return res
        except BaseException:
            _kill_group(proc)
            raise
    res.duration_s = round(time.monotonic() - t0, 1)
    if not junit.exists():
        res.status, res.detail = "failed", f"pytest exited with {proc.returncode} and wrote no report"
        res.errors = 1
        return res
    res.passed, res.failed, res.errors, res.skipped, _ = parse_junit(junit)
    if res.failed or res.errors or proc.returncode not in (0, 5):
        res.status = "failed"
        res.detail = f"pytest exit code {proc.returncode}"
    elif res.passed == 0:
        res.status, res.detail = "no-tests", "no test ran in this environment"
    return res


def env_timeout(name: str, durations: dict[str, float] | None = None) -> float:
    """Seconds an environment's pytest may run: MAXTEXT_COMPAT_ENV_TIMEOUT, else 4x its recorded time (the longer
    of cold and warm; at least 30 min; an hour when none is recorded). A hang (an interpreter deadlock, a server
    that never answers) ends as a failed environment instead of stalling the whole run."""
    from maxtext_compat.switches import env_positive_number

    seconds = env_positive_number(
        TIMEOUT_VAR, example="3600", default="4x each environment's recorded time", maximum=MAX_TIMEOUT_S
    )
    if seconds is not None:
        return seconds
    recorded = (durations if durations is not None else longest_durations()).get(name)
    return max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * recorded) if recorded else DEFAULT_TIMEOUT_S


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _durations_path(path: Path | None) -> Path | None:
    root = workspace.checkout_root()
    return path if path is not None else None if root is None else root / DURATIONS_FILE


def expected_durations(
    path: Path | None = None, *, cold: bool | None = None, matrix: CompatMatrix | None = None
) -> dict[str, float]:
    """Recorded seconds per environment (by default this checkout's; empty when the file is missing or
    unreadable): the cold figure where `cold`, the warm one where not, and by default the one matching each
    environment's compilation cache now (of `matrix`'s folders; the other where only one was measured)."""
    recorded = envdurations.read(_durations_path(path))
    if cold is not None:
        return envdurations.planned(recorded, lambda _name: cold)
    return envdurations.planned(recorded, lambda name: cache_is_cold(name, matrix))


def longest_durations(path: Path | None = None) -> dict[str, float]:
    """The longer of each environment's recorded figures (what its time limit allows)."""
    return {name: r.longest() for name, r in envdurations.read(_durations_path(path)).items()}


def record_durations(results: Sequence[EnvResult], path: Path | None = None) -> Path:
    """Write the seconds of this run's environments into the durations file, each as its cold or warm figure
    (the state of its compilation cache when it started), and their peak memory into tests/env_memory.json
    beside it (others are kept)."""
    p = path if path is not None else envs.project_root() / DURATIONS_FILE
    ok = [r for r in results if r.status == "ok"]
    # Its own work: the time it waited for another environment's heavy phase to end is not.
    seconds = {r.name: round(r.duration_s - r.gate_wait_s, 1) for r in ok}
    envdurations.write(p, seconds, cold={r.name for r in ok if r.cold_cache})
    memory = p.with_name(Path(MEMORY_FILE).name)
    record_peaks({r.name: r.peak_memory_gb for r in ok if r.peak_memory_gb > 0}, memory)
    record_peaks({r.name: r.light_peak_gb for r in ok if r.light_peak_gb > 0}, light_memory_file(memory))
    return p


def schedule(names: Sequence[str], durations: dict[str, float]) -> list[str]:
    """Longest recorded first (unknown ones first of all: they may be the long ones), else matrix order."""
    order = {n: i for i, n in enumerate(names)}
    return sorted(names, key=lambda n: (n in durations, -durations.get(n, 0.0), order[n]))


def run_matrix(
    names: Sequence[str] | None = None,
    *,
    matrix: CompatMatrix | None = None,
    pytest_args: Sequence[str] = (),
    build: bool = True,
    report_dir: Path | None = None,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    ws: Workspace | None = None,
    run: dict[str, object] | None = None,
) -> list[EnvResult]:
    """Run every selected environment of the workspace (default: this checkout, else the current folder's project);
    with jobs > 1, that many at once, each logging to its logs/ folder."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgumentError(
            "jobs must be >= 1",
            argument="jobs",
            expected="a whole number >= 1 (environments run at once)",
            found=repr(jobs),
            fix="pass jobs=1 to run environments one after another",
        )
    ws = ws if ws is not None else workspace.default()
    m = matrix if matrix is not None else ws.matrix
    out_dir = report_dir if report_dir is not None else ws.state
    out_dir.mkdir(parents=True, exist_ok=True)
    selected = list(names) if names else plain_run(m, log)
    cold = {name: cache_is_cold(name, m) for name in selected}  # before any runs: each records the case it was
    peaks = recorded_peaks(ws.memory_file) if ws.memory_file is not None else {}
    light = gated(peaks, recorded_peaks(light_memory_file(ws.memory_file))) if ws.memory_file is not None else {}
    gate_dir = out_dir / "heavy-gate"
    gate_dir.mkdir(exist_ok=True)
    for stale in gate_dir.glob(f"*{HEAVY_MARK_SUFFIX}"):  # an earlier run's marks would read as heavy phases now
        stale.unlink(missing_ok=True)
    gates = {name: gate_lock(gate_dir, name, light) for name in selected}
    if pruned := prune_unused_caches():
        log(f"[matrix] pruned {len(pruned)} cache entries unused for {UNUSED_CACHE_MAX_AGE_S / 86400:.0f} days")
    if jobs == 1:
        results = []
        for i, name in enumerate(selected, 1):
            log(f"[matrix] ({i}/{len(selected)}) environment {name}")
            results.append(
                run_env(
                    name,
                    matrix=m,
                    pytest_args=pytest_args,
                    build=build,
                    report_dir=out_dir,
                    log=log,
                    ws=ws,
                    cold_cache=cold[name],
                    gate=gates[name],
                )
            )
    else:
        results = _run_parallel(selected, m, pytest_args, build, out_dir, log, jobs, ws, cold, gates, peaks, light)
    about = {"project": ws.project_name, "selected": selected, **(run or {})}
    write_reports(results, m, out_dir, claims=ws.is_checkout, run=about)
    return results


def plain_run(matrix: CompatMatrix, log: Callable[[str], None] = print) -> list[str]:
    """The environments a run that names none runs: all but those marked `extended: true`, which run with
    MAXTEXT_COMPAT_EXTENDED=1 (make test-extended) or when named. Says which it left out."""
    from maxtext_compat.switches import env_flag

    every = list(matrix.environments)
    if env_flag(EXTENDED_VAR):
        return every
    left = [name for name in every if matrix.environments[name].extended]
    if left:
        log(f"[matrix] left out (extended: {EXTENDED_VAR}=1 or name them to run them): {', '.join(left)}")
    return [name for name in every if name not in left]


def shard_durations(ws: Workspace) -> dict[str, float]:
    """The durations every machine of a sharded run has alike: this checkout's committed record, cold figures (a
    shard runs on a machine of its own, fresh in CI; a split that read each machine's caches could differ between
    machines); none in a user's project (its record is written on each machine)."""
    return expected_durations(ws.durations_file, cold=True) if ws.is_checkout else {}


def shard(names: Sequence[str], part: int, parts: int, durations: dict[str, float] | None = None) -> list[str]:
    """Shard `part` of `parts` (1-based) of `names`: the longest recorded first, each to the lightest shard (an
    unknown duration counts as the longest known, or 1; ties: the fewest names, then the lowest shard). Every
    machine given the same names and recorded durations computes the same split: the shards cover `names` once."""
    if not (isinstance(parts, int) and isinstance(part, int) and 1 <= part <= parts):
        raise InvalidArgumentError(
            "is not a shard of the run",
            argument="--shard",
            expected="K/N with 1 <= K <= N, e.g. 1/2",
            found=f"{part}/{parts}",
            fix="number the shards from 1 to N; every machine passes the same N",
        )
    known = durations or {}
    default = max(known.values(), default=1.0) or 1.0
    load, count = [0.0] * parts, [0] * parts
    mine = set()
    for name in schedule(list(names), known):
        k = min(range(parts), key=lambda i: (load[i], count[i], i))  # equal loads (zeros): the fewest names
        load[k] += known.get(name, default)
        count[k] += 1
        if k == part - 1:
            mine.add(name)
    return [n for n in names if n in mine]


def _run_parallel(
    selected: list[str],
    m: CompatMatrix,
    pytest_args: Sequence[str],
    build: bool,
    out_dir: Path,
    log: Callable[[str], None],
    jobs: int,
    ws: Workspace,
    cold: dict[str, bool],
    gates: dict[str, Path],
    peaks: dict[str, float],
    light: dict[str, float],
) -> list[EnvResult]:
    lock, build_lock = fork_safe_lock(), fork_safe_lock()

    def say(msg: str) -> None:
        with lock:
            log(msg)

    def one(name: str) -> EnvResult:
        logfile = out_dir / "logs" / f"{name}.log"
        say(f"[matrix] {name}: started (output in {logfile})")
        res = run_env(
            name,
            matrix=m,
            pytest_args=pytest_args,
            build=build,
            report_dir=out_dir,
            log=say,
            output=logfile,
            build_lock=build_lock,
            ws=ws,
            cold_cache=cold[name],
            gate=gates[name],
        )
        waited = f" ({res.gate_wait_s:.0f}s of it waiting for the heavy phase's gate)" if res.gate_wait_s >= 1 else ""
        say(
            f"[matrix] {name}: {res.status}, {res.passed} passed, {res.failed + res.errors} failed, "
            f"{res.skipped} skipped in {res.duration_s:.0f}s{waited}"
        )
        if not res.ok and logfile.exists():
            tail = logfile.read_text(encoding="utf-8", errors="replace").splitlines()[-80:]
            say("\n".join([f"[matrix] {name}: last lines of {logfile}:", *tail]))
        return res

    order = schedule(selected, expected_durations(ws.durations_file, matrix=m))
    if light:
        say(f"[matrix] heavy phases one at a time: {', '.join(n for n in order if n in light)}")

    def in_heavy_phase(name: str) -> bool:
        return heavy_mark(gates[name].parent, name).exists()

    done = run_admitted(order, peaks, jobs, one, light=light, in_heavy_phase=in_heavy_phase)
    return [done[n] for n in selected]


if __name__ == "__main__":  # pragma: no cover
    rs = run_matrix(sys.argv[1:] or None)
    print(render_table(rs))
    print(closing_line(rs))
    sys.exit(main_exit_code(rs))
