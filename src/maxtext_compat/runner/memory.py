"""How much memory each matrix environment's test run takes, and running several only where it fits.

Why: on a 2-core box one environment keeps about 1.2 cores busy (imports, tracing and compiles are
single-threaded), so a third environment at once shortens `make test`; but the environments that start
`vllm serve` hold several GB each, and three of them at once would not fit. Each run's peak (the summed
proportional set size of its process tree: pytest, servers, partner processes) is measured while it
runs and recorded in tests/env_memory.json; the scheduler starts an environment only when the recorded peaks
of those running plus its own fit the budget.

A peak lasts minutes of a run that takes half an hour: the servers and real models come last in an environment's
run (its heavy phase), and before them it holds a few GB. A matrix run therefore hands each environment a lock
file (`GATE_VAR`): its test process takes it before its first heavy test, marks the phase's start (`MARK_VAR`) and
holds it until it exits (`enter_heavy_phase`). The gated environments share one lock, so one of them at a time is in
its heavy phase, and the scheduler counts each running one at its light peak (its peak before the mark, recorded in
tests/env_memory_light.json) plus the largest heavy excess among them, instead of every one at its peak. Once one of
them holds the lock (its mark is there), it counts that one's excess, and what the next holder's would be after it
ends: an environment waiting for the lock leaves its core to one that fits beside the holder. The others
(a small heavy excess, or no light peak recorded yet) each get a lock of their own, never wait, and count at their
peak as before; their marks record their light peaks for the next plan.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from maxtext_compat.locks import fork_safe_lock

MEMORY_FILE = "tests/env_memory.json"
LIGHT_MEMORY_NAME = "env_memory_light.json"  # beside MEMORY_FILE: each environment's peak before its heavy phase
GATE_VAR = "MAXTEXT_COMPAT_HEAVY_GATE"  # the lock file an environment's test process takes for its heavy phase
MARK_VAR = "MAXTEXT_COMPAT_HEAVY_MARK"  # the file it writes when its heavy phase begins (the seconds it waited)
HEAVY_MARK_SUFFIX = ".heavy"  # NAME.heavy in the run's gate folder: environment NAME is in its heavy phase
SHARED_LOCK = "shared.lock"  # the gated environments' one lock, in the run's gate folder
GATE_MIN_EXCESS_GB = 2.0  # an environment whose peak exceeds its light peak by less runs ungated, counted at its peak
BUDGET_VAR = "MAXTEXT_COMPAT_MEMORY_GB"
# Of the machine's memory, when BUDGET_VAR is unset. The plan sums each environment's highest reading (light peaks,
# plus the largest heavy excess), which never all happen at once: on the 23.5-GiB machine the most in use while
# the plan reserved up to 18.8 GB was 14.3 GB. 82% lets the two longest environments (maxtext-0.2.5 and
# 0.1.0-jax011: 19.1 GB planned) run side by side and leaves 4.2 GiB beside the plan.
BUDGET_SHARE = 0.82
MAX_BUDGET_GB = float(1 << 20)  # 1 PiB: anything above is a typo
UNKNOWN_PEAK_GB = 8.0  # an environment with no recorded peak counts as a heavy one
SMALL_PEAK_GB = 2.0  # the kernel-only environments and the unit tests: what fills the room beside a large one
SAMPLE_INTERVAL_S = 1.0  # a reading costs ~6 ms of CPU (every process's stat, the tree's statm; measured)
HOLDER_POLL_S = 5.0  # how often a waiting start looks again at which environment holds the gate (its mark appears)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
T = TypeVar("T")


def _statm(pid: int) -> tuple[int, int]:
    """(resident, shared file-backed) bytes of a process, from its kernel counters; (0, 0) once it has ended."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            fields = f.read().split()
    except OSError:
        return 0, 0
    return int(fields[1]) * _PAGE, int(fields[2]) * _PAGE


def tree_memory_gb(root: int) -> float:
    """Memory (GB) of process `root` and all its descendants (Linux /proc; 0.0 where unreadable): each process's
    private resident memory, plus the largest shared (file-backed) resident set once, which the processes of one
    environment mostly share (the same jaxlib, torch and vllm libraries). By parent links, not by session: the
    serving tests start `vllm serve` in a session of its own. Every figure is a counter the kernel keeps (stat, statm).

    Why not PSS: smaps_rollup walks a process's page tables holding its mmap lock, 0.19 s of CPU for a tree of
    JAX and vLLM processes (measured), and the process's own mmap calls wait meanwhile: JAX processes sampled
    every second were seen blocked in mmap while the machine sat partly idle."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command: state ppid ... (proc(5))
        except OSError:
            continue  # the process ended while we looked
        parent[int(entry.name)] = int(fields[1])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    members, todo = [], [root] if root in parent else []
    while todo:
        pid = todo.pop()
        members.append(pid)
        todo.extend(children.get(pid, ()))
    counts = [_statm(pid) for pid in members]
    private = sum(resident - shared for resident, shared in counts)
    return (private + max((shared for _, shared in counts), default=0)) / 2**30


class PeakSampler:
    """Samples a process tree's memory (`tree_memory_gb`) every `interval` seconds in a thread; `.peak_gb` once
    stopped. `reader(root)`: the tree's memory (GB)."""

    def __init__(
        self,
        root: int,
        interval: float = SAMPLE_INTERVAL_S,
        reader: Callable[[int], float] = tree_memory_gb,
        heavy_mark: Path | None = None,
    ) -> None:
        self.root, self.interval, self._reader, self._heavy_mark = root, interval, reader, heavy_mark
        self.peak_gb = 0.0
        self.light_peak_gb = 0.0  # the peak while `heavy_mark` did not exist yet (before the heavy phase)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memory-{root}", daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            # asked first: a sample after the mark appeared may already hold the heavy phase's memory
            light = self._heavy_mark is None or not self._heavy_mark.exists()
            now = self._reader(self.root)
            self.peak_gb = max(self.peak_gb, now)
            if light:
                self.light_peak_gb = max(self.light_peak_gb, now)
            if self._stop.wait(self.interval):
                return


_HELD_GATE: list[int] = []  # the gate's lock, held by this process from its heavy phase until it exits


def enter_heavy_phase() -> float:
    """Wait until this test process may start its heavy phase (servers, real models) and hold the gate until it
    exits; returns the seconds waited. Outside a gated matrix run, or once held, it returns 0.0 at once.

    The lock is a `flock` on the file GATE_VAR names: the kernel releases it when the process ends however it
    ends, so a crashed environment never holds it; children started with `subprocess` do not inherit it. The
    phase's start is written to the file MARK_VAR names, which the runner's memory sampler watches."""
    lock, mark = os.environ.get(GATE_VAR), os.environ.get(MARK_VAR)
    if not lock or not mark or _HELD_GATE:
        return 0.0
    import fcntl  # POSIX only, as the matrix runner is (it reads /proc)

    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        from maxtext_compat.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{GATE_VAR} names a lock file that cannot be opened",
            argument=GATE_VAR,
            expected="a writable path (the matrix runner sets it for each environment's run)",
            found=f"{lock!r}: {exc.strerror}",
            fix=f"unset {GATE_VAR} and {MARK_VAR} outside `maxtext-compat matrix`",
        ) from exc
    t0 = time.monotonic()
    fcntl.flock(fd, fcntl.LOCK_EX)
    waited = time.monotonic() - t0
    _HELD_GATE.append(fd)
    Path(mark).write_text(f"{waited:.1f}\n", encoding="ascii")
    return waited


def heavy_mark(gate: Path, name: str) -> Path:
    """Where environment `name`'s test process marks the start of its heavy phase (with the seconds it waited)."""
    return gate / f"{name}{HEAVY_MARK_SUFFIX}"


def gate_lock(gate: Path, name: str, gated_names: Collection[str]) -> Path:
    """The lock file environment `name` takes for its heavy phase: the shared one when it is gated, else its own."""
    return gate / (SHARED_LOCK if name in gated_names else f"{name}.lock")


def gate_waited(gate: Path, name: str) -> float | None:
    """The seconds environment `name` waited for its lock, or None when its run had no heavy phase."""
    try:
        return float(heavy_mark(gate, name).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None


def recorded_peaks(path: Path) -> dict[str, float]:
    """Recorded peak GB per environment (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float)) and v >= 0}


def record_peaks(peaks: dict[str, float], path: Path) -> Path:
    """Write these environments' peaks into the file (others are kept), rounded up to 0.1 GB."""
    data = recorded_peaks(path)
    data.update({k: math.ceil(v * 10 - 1e-9) / 10 for k, v in peaks.items()})
    path.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n", encoding="utf-8")
    return path


def light_memory_file(memory_file: Path) -> Path:
    """The light peaks' file beside the peaks' file."""
    return memory_file.with_name(LIGHT_MEMORY_NAME)


def machine_memory_gb() -> float:
    """Total memory of this machine in GB (from /proc/meminfo; sysconf elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def memory_budget_gb() -> float:
    """MAXTEXT_COMPAT_MEMORY_GB, else 82% of the machine's memory."""
    from maxtext_compat.switches import env_positive_number

    gb = env_positive_number(BUDGET_VAR, example="20", default="82% of this machine's memory", maximum=MAX_BUDGET_GB)
    return BUDGET_SHARE * machine_memory_gb() if gb is None else gb


def gated(peaks: dict[str, float], light: dict[str, float]) -> dict[str, float]:
    """The light peak of each environment whose heavy phase is gated: one with a recorded light peak below its peak
    by at least GATE_MIN_EXCESS_GB."""
    return {n: lo for n, lo in light.items() if n in peaks and peaks[n] - lo >= GATE_MIN_EXCESS_GB}


class Admission:
    """Starts environments at most `jobs` at once and only while their recorded peaks fit the budget.

    The first in order that fits starts (the order is longest first, but an environment that fits beside none but
    the small ones comes first of all; a small one may start before a big one that has to wait for memory); one
    that alone exceeds the budget runs by itself. `light`: the gated
    environments' light peaks (`gated`); running ones count at their light peak plus the largest heavy excess
    among them (only one is in its heavy phase at a time), the others at their peak."""

    def __init__(
        self,
        order: Sequence[str],
        peaks: dict[str, float],
        jobs: int,
        budget_gb: float,
        light: dict[str, float] | None = None,
        in_heavy_phase: Callable[[str], bool] | None = None,
    ) -> None:
        self._peaks = {n: peaks.get(n, UNKNOWN_PEAK_GB) for n in order}
        self._light = {n: min(lo, self._peaks[n]) for n, lo in (light or {}).items() if n in self._peaks}
        self._jobs, self._budget = jobs, budget_gb
        self._in_heavy_phase = in_heavy_phase
        # The environments that fit beside none but the small ones start first, while the small ones are there to
        # run beside them; started later, they would run alone (stable: each group keeps the given order).
        lonely = {n for n in order if self._lonely(n, order)}
        self._order = [n for n in order if n in lonely] + [n for n in order if n not in lonely]
        self._running: set[str] = set()
        self._cond = threading.Condition(fork_safe_lock())

    def _lonely(self, name: str, order: Sequence[str]) -> bool:
        """Whether `name` fits the budget beside no other environment of `order` but the small ones."""
        others = [m for m in order if m != name and self._peaks[m] > SMALL_PEAK_GB]
        return bool(others) and all(self.needs_gb([name, m]) > self._budget for m in others)

    def needs_gb(self, names: Sequence[str], holder: str | None = None) -> float:
        """The memory `names` running together may take: the gated at their light peaks plus the largest of their
        heavy excesses, the others at their peaks. With `holder` (the gated one in its heavy phase now, which keeps
        the gate until its process ends): the larger of now (its excess) and after it (another's excess, its own
        memory gone)."""
        others = sum(self._peaks[n] for n in names if n not in self._light)
        lights = sum(self._light[n] for n in names if n in self._light)
        excess = {n: self._peaks[n] - self._light[n] for n in names if n in self._light}
        if holder not in excess:
            return others + lights + max(excess.values(), default=0.0)
        assert holder is not None
        after = max((e for n, e in excess.items() if n != holder), default=0.0)
        return others + lights + max(excess[holder], after - self._light[holder])

    def _holder(self) -> str | None:
        """The running gated environment in its heavy phase (None: none yet, or no way to tell)."""
        if self._in_heavy_phase is None:
            return None
        return next((n for n in sorted(self._running) if n in self._light and self._in_heavy_phase(n)), None)

    def _first_fitting(self) -> str | None:
        if len(self._running) >= self._jobs:
            return None
        running, holder = list(self._running), self._holder()
        for name in self._order:
            if not self._running or self.needs_gb([*running, name], holder) <= self._budget:
                return name
        return None

    def startable(self) -> str | None:
        """The environment `next()` would start now without waiting (None: it would wait, or none is left)."""
        with self._cond:
            return self._first_fitting() if self._order else None

    def next(self) -> str | None:
        """The next environment to start (blocks until one fits); None when every one has started."""
        with self._cond:
            if not self._order:
                return None
            # A holder's mark appears without a call here: with a way to read it, look again every HOLDER_POLL_S.
            poll = HOLDER_POLL_S if self._in_heavy_phase is not None else None
            while (name := self._first_fitting()) is None:
                self._cond.wait(poll)
            assert name is not None
            self._order.remove(name)
            self._running.add(name)
            return name

    def finished(self, name: str) -> None:
        with self._cond:
            self._running.discard(name)
            self._cond.notify_all()


def run_admitted(
    order: Sequence[str],
    peaks: dict[str, float],
    jobs: int,
    work: Callable[[str], T],
    budget_gb: float | None = None,
    light: dict[str, float] | None = None,
    in_heavy_phase: Callable[[str], bool] | None = None,
) -> dict[str, T]:
    """`work(name)` for every name, at most `jobs` at once, each started by `Admission` (in `order`, when its
    recorded peak fits `budget_gb`, default `memory_budget_gb()`; `light`: the gated environments' light peaks, whose
    `work` must pass them the gate; `in_heavy_phase(name)`: whether its mark is there); returns each name's result.
    The one scheduler of the test matrix and of the demo in every environment. A `work` that raises raises here
    once all have ended."""
    budget = memory_budget_gb() if budget_gb is None else budget_gb
    gate = Admission(order, peaks, jobs, budget, light, in_heavy_phase)

    def finished(name: str, _future: Future[T]) -> None:
        gate.finished(name)

    futures: dict[str, Future[T]] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while (name := gate.next()) is not None:  # waits until the next one's recorded peak fits
            future = pool.submit(work, name)
            future.add_done_callback(functools.partial(finished, name))
            futures[name] = future
    return {n: f.result() for n, f in futures.items()}
