"""Memory-aware scheduling of matrix environments: measured peaks, a budget, and an order that is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from maxtext_compat import envmemory
from maxtext_compat.errors import InvalidArgumentError

pytestmark = pytest.mark.envs("unit")


def _drain(gate: envmemory.Admission, hold: dict[str, threading.Event], log: list[tuple[str, frozenset[str]]]):
    """Start each admitted name in a thread that ends when its event is set; log who ran alongside it."""
    running: set[str] = set()
    lock = threading.Lock()

    def work(name: str) -> None:
        hold[name].wait(5)
        with lock:
            running.discard(name)
        gate.finished(name)

    threads = []
    while (name := gate.next()) is not None:
        with lock:
            running.add(name)
            log.append((name, frozenset(running)))
        t = threading.Thread(target=work, args=(name,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def test_environments_start_longest_first_only_while_their_peaks_fit():
    order = ["big-a", "big-b", "big-c", "small"]
    peaks = {"big-a": 8.0, "big-b": 8.0, "big-c": 8.0, "small": 1.0}
    gate = envmemory.Admission(order, peaks, jobs=3, budget_gb=18.0)
    hold = {n: threading.Event() for n in order}
    log: list[tuple[str, frozenset[str]]] = []
    t = threading.Thread(target=_drain, args=(gate, hold, log))
    t.start()
    time.sleep(0.3)
    # big-c (8 GB) does not fit beside 16 GB; small (1 GB) does, and starts before it
    assert [n for n, _ in log] == ["big-a", "big-b", "small"]
    hold["big-a"].set()
    time.sleep(0.3)
    assert [n for n, _ in log] == ["big-a", "big-b", "small", "big-c"]  # 8 + 1 + 8 <= 18
    for e in hold.values():
        e.set()
    t.join(5)
    assert all(len(with_) <= 3 for _, with_ in log)
    assert sum(peaks[n] for n in log[-1][1]) <= 18.0


def test_an_environment_larger_than_the_budget_runs_alone_and_unknown_ones_count_as_heavy():
    gate = envmemory.Admission(["huge", "new"], {"huge": 50.0}, jobs=3, budget_gb=10.0)
    assert gate.next() == "huge"  # nothing running: it starts, alone
    started: list[str | None] = []
    t = threading.Thread(target=lambda: started.append(gate.next()))
    t.start()
    time.sleep(0.2)
    assert started == []  # "new" (no record: 8 GB) waits for "huge"
    gate.finished("huge")
    t.join(5)
    assert started == ["new"] and gate.next() is None


def test_jobs_caps_the_count_even_when_memory_allows():
    gate = envmemory.Admission(["a", "b", "c"], {"a": 0.1, "b": 0.1, "c": 0.1}, jobs=2, budget_gb=100.0)
    assert [gate.next(), gate.next()] == ["a", "b"]
    started: list[str | None] = []
    t = threading.Thread(target=lambda: started.append(gate.next()))
    t.start()
    time.sleep(0.2)
    assert started == []
    gate.finished("b")
    t.join(5)
    assert started == ["c"]


def test_tree_memory_counts_the_children():
    me = envmemory.tree_memory_gb(os.getpid())
    assert me > 0.01  # this interpreter alone holds well over 10 MB
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
         "print('ready', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with_child = envmemory.tree_memory_gb(os.getpid())
        assert with_child - me >= 0.18  # the child's 200 MB are counted
        assert envmemory.tree_memory_gb(child.pid) >= 0.18
    finally:
        child.kill()
        child.wait()
    assert envmemory.tree_memory_gb(child.pid) == 0.0  # gone: nothing to count


def test_the_sampler_keeps_the_highest_reading():
    readings = iter([1.0, 3.5, 2.0] + [0.5] * 1000)
    with envmemory.PeakSampler(1, interval=0.01, reader=lambda _pid: next(readings)) as sampler:
        time.sleep(0.2)
    assert sampler.peak_gb == 3.5


def test_peaks_are_recorded_rounded_up_and_read_leniently(tmp_path):
    path = tmp_path / "env_memory.json"
    path.write_text(json.dumps({"old": 2.0, "bad": "x", "neg": -1}))
    envmemory.record_peaks({"new": 5.01}, path)
    assert envmemory.recorded_peaks(path) == {"old": 2.0, "new": 5.1}
    path.write_text("not json")
    assert envmemory.recorded_peaks(path) == {}
    assert envmemory.recorded_peaks(tmp_path / "missing.json") == {}


@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan", "inf", "1e400", "1e7"])
def test_a_memory_budget_that_is_not_gb_is_refused(monkeypatch, value):
    monkeypatch.setenv(envmemory.BUDGET_VAR, value)
    with pytest.raises(InvalidArgumentError, match=envmemory.BUDGET_VAR) as e:
        envmemory.memory_budget_gb()
    assert repr(value) in str(e.value) and "Fix:" in str(e.value)


def test_the_default_budget_is_a_share_of_this_machine(monkeypatch):
    monkeypatch.delenv(envmemory.BUDGET_VAR, raising=False)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert envmemory.memory_budget_gb() == pytest.approx(0.8 * total, rel=0.02)
