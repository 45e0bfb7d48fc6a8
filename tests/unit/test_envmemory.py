"""Memory-aware scheduling of matrix environments: measured peaks, a budget, and an order that is kept."""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.runner import memory as envmemory

pytestmark = pytest.mark.envs("unit")


HANG_GUARD_S = 600  # only a hang reaches it: every wait below is for an event, whatever the machine's load


def test_environments_start_longest_first_only_while_their_peaks_fit():
    order = ["big-a", "big-b", "big-c", "small"]
    peaks = {"big-a": 8.0, "big-b": 8.0, "big-c": 8.0, "small": 1.0}
    gate = envmemory.Admission(order, peaks, jobs=3, budget_gb=18.0)
    # big-c (8 GB) does not fit beside 16 GB; small (1 GB) does, and starts before it
    assert [gate.next(), gate.next(), gate.next()] == ["big-a", "big-b", "small"]
    assert gate.startable() is None  # next() would wait: 8 + 8 + 1 + 8 > 18
    gate.finished("big-a")
    assert gate.startable() == "big-c" and gate.next() == "big-c"  # 8 + 1 + 8 <= 18
    assert gate.next() is None


def test_a_waiting_start_wakes_when_an_environment_finishes():
    """next() blocks while nothing fits and returns when finished() makes room (no sleep: the result is waited on)."""
    gate = envmemory.Admission(["a", "b"], {"a": 8.0, "b": 8.0}, jobs=2, budget_gb=10.0)
    assert gate.next() == "a" and gate.startable() is None
    started: list[str | None] = []
    t = threading.Thread(target=lambda: started.append(gate.next()))
    t.start()
    gate.finished("a")  # whether the thread already waits or not, it must now get "b"
    t.join(HANG_GUARD_S)
    assert started == ["b"]


def test_an_environment_larger_than_the_budget_runs_alone_and_unknown_ones_count_as_heavy():
    gate = envmemory.Admission(["huge", "new"], {"huge": 50.0}, jobs=3, budget_gb=10.0)
    assert gate.next() == "huge"  # nothing running: it starts, alone
    assert gate.startable() is None  # "new" (no record: 8 GB) waits for "huge"
    gate.finished("huge")
    assert gate.next() == "new" and gate.next() is None


def test_jobs_caps_the_count_even_when_memory_allows():
    gate = envmemory.Admission(["a", "b", "c"], {"a": 0.1, "b": 0.1, "c": 0.1}, jobs=2, budget_gb=100.0)
    assert [gate.next(), gate.next()] == ["a", "b"]
    assert gate.startable() is None
    gate.finished("b")
    assert gate.next() == "c"


def test_gated_environments_count_at_their_light_peaks_plus_the_largest_heavy_excess():
    """Three heavy environments (peaks 12, 11, 10 GB; light 3, 3, 2) never fit together at their peaks (18 GB budget),
    but with one heavy phase at a time they do: 3 + 3 + 2 + the largest excess 9 = 17."""
    peaks = {"a": 12.0, "b": 11.0, "c": 10.0, "small": 1.5}
    light = envmemory.gated(peaks, {"a": 3.0, "b": 3.0, "c": 2.0, "small": 1.0})
    assert light == {"a": 3.0, "b": 3.0, "c": 2.0}  # "small" exceeds its light peak by 0.5 GB: not gated
    gate = envmemory.Admission(["a", "b", "c", "small"], peaks, jobs=4, budget_gb=18.0, light=light)
    assert gate.needs_gb(["a", "b", "c"]) == pytest.approx(17.0)
    assert gate.needs_gb(["a", "small"]) == pytest.approx(3.0 + 9.0 + 1.5)  # the ungated at its peak
    assert [gate.next(), gate.next(), gate.next()] == ["a", "b", "c"]
    assert gate.startable() is None  # 17 + 1.5 > 18
    ungated = envmemory.Admission(["a", "b", "c"], peaks, jobs=3, budget_gb=18.0)
    assert ungated.next() == "a" and ungated.startable() is None  # at their peaks, one at a time


# The matrix's two longest environments (maxtext-0.2.5: peak 10.6, light 6.1; 0.1.0-jax011: 13.0, 7.2 GB) on the
# 23.5-GiB machine's budget, and a kernel-only one: before either holds the gate the small one does not fit.
LONG = {"p25": 10.6, "j11": 13.0, "small": 1.3}
LONG_LIGHT = {"p25": 6.1, "j11": 7.2}


def test_an_environment_waiting_for_the_gate_leaves_room_beside_the_holder(monkeypatch):
    """0.2.5 in its heavy phase and 0.1.0-jax011 waiting for the gate: a kernel-only one fits beside them (now 6.1 +
    4.5 + 7.2 + 1.3; after 0.2.5 ends, 7.2 + 5.8 + 1.3), though 'the largest excess' alone would refuse it."""
    heavy: set[str] = set()
    monkeypatch.setattr(envmemory, "HOLDER_POLL_S", 0.05)
    gate = envmemory.Admission(["p25", "j11", "small"], LONG, 3, 19.3, LONG_LIGHT, lambda n: n in heavy)
    assert [gate.next(), gate.next()] == ["p25", "j11"] and gate.startable() is None  # 19.1 + 1.3 > 19.3
    started: list[str | None] = []
    t = threading.Thread(target=lambda: started.append(gate.next()))
    t.start()
    heavy.add("p25")  # its mark appears: no finished() call wakes the waiting start, it looks again by itself
    t.join(HANG_GUARD_S)
    assert started == ["small"]
    assert gate.needs_gb(["p25", "j11", "small"], holder="p25") == pytest.approx(6.1 + 4.5 + 7.2 + 1.3)
    # jax011 holding it instead: its own excess (5.8) is the one now, and the small one does not fit
    assert gate.needs_gb(["p25", "j11", "small"], holder="j11") == pytest.approx(6.1 + 7.2 + 5.8 + 1.3)


def test_the_holder_counts_what_the_next_holder_takes_after_it():
    """A holder with a small excess: beside it now fits, but once it ends the waiting one's heavy phase would not."""
    peaks, light = {"a": 6.0, "b": 17.0, "s": 2.0}, {"a": 3.0, "b": 2.0}
    gate = envmemory.Admission(["a", "b", "s"], peaks, 3, 18.0, light, lambda n: n == "a")
    assert gate.needs_gb(["a", "b", "s"], holder="a") == pytest.approx(2.0 + 2.0 + 15.0)  # after a: b's 15 GB excess
    assert [gate.next(), gate.next()] == ["a", "b"] and gate.startable() is None


def _oracle_gb(names, peaks, light, holder):
    """Every state the gate allows, summed process by process: at most one gated environment heavy (the holder,
    or after it ends any other), the rest of the gated at their light peaks, the ungated at their peaks."""

    def total(members, heavy):
        return sum(peaks[n] if n not in light or n == heavy else light[n] for n in members)

    gated_names = [n for n in names if n in light]
    if holder in gated_names:
        rest = [n for n in names if n != holder]
        return max([total(names, holder)] + [total(rest, g) for g in gated_names if g != holder] + [total(rest, None)])
    return max([total(names, g) for g in gated_names] + [total(names, None)])


@given(
    st.lists(st.tuples(st.floats(0.5, 16.0), st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=5),
    st.integers(-1, 4),
)
@settings(max_examples=300, deadline=None)
def test_needs_gb_is_the_largest_state_the_gate_allows(envs, holder_index):
    names = [f"e{i}" for i in range(len(envs))]
    peaks = {n: p for n, (p, _, _) in zip(names, envs, strict=True)}
    light = {n: p * f for n, (p, f, g) in zip(names, envs, strict=True) if g}
    gate = envmemory.Admission(names, peaks, 5, 100.0, light)
    holder = names[holder_index] if 0 <= holder_index < len(names) and names[holder_index] in light else None
    assert gate.needs_gb(names, holder) == pytest.approx(_oracle_gb(names, peaks, light, holder))


def _scripted_sampler(tmp_path, readings: list[float], mark_after: float) -> envmemory.PeakSampler:
    """A PeakSampler over `readings` (then 0.0 until it stops), the heavy phase's mark written during the reading
    `mark_after`."""
    mark = tmp_path / "env.heavy"
    values = iter(readings)
    done = threading.Event()

    def reader(_pid: int) -> float:
        value = next(values, None)
        if value == mark_after:
            mark.write_text("0.0\n")  # the heavy phase begins after this reading
        if value is None:
            done.set()
            return 0.0
        return value

    with envmemory.PeakSampler(1, interval=0.001, reader=reader, heavy_mark=mark) as sampler:
        assert done.wait(HANG_GUARD_S)
    return sampler


def test_the_sampler_splits_the_peak_at_the_heavy_mark(tmp_path):
    sampler = _scripted_sampler(tmp_path, [2.0, 3.0, 9.0, 4.0], mark_after=3.0)
    assert (sampler.light_peak_gb, sampler.peak_gb) == (3.0, 9.0)


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""

ENTER = """
import os, sys
from maxtext_compat.runner import memory as envmemory
waited = envmemory.enter_heavy_phase()
print(f"{waited:.2f}", flush=True)
assert envmemory.enter_heavy_phase() == 0.0  # held already: at once
"""


def test_the_heavy_phase_waits_for_the_shared_lock_and_marks_its_start(tmp_path):
    """A test process entering its heavy phase waits while another holds the shared lock, then writes its mark with
    the seconds it waited; the kernel frees the lock when that process exits."""
    lock = envmemory.gate_lock(tmp_path, "maxtext-0.2.5", {"maxtext-0.2.5": 3.0})
    assert lock == tmp_path / envmemory.SHARED_LOCK
    assert envmemory.gate_lock(tmp_path, "unit", {"maxtext-0.2.5": 3.0}) == tmp_path / "unit.lock"  # its own
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    mark = envmemory.heavy_mark(tmp_path, "maxtext-0.2.5")
    env = {**os.environ, envmemory.GATE_VAR: str(lock), envmemory.MARK_VAR: str(mark)}
    out = subprocess.run([sys.executable, "-c", ENTER], env=env, capture_output=True, text=True, check=True,
                         timeout=HANG_GUARD_S)  # fmt: skip
    holder.wait()
    waited = float(out.stdout.strip())
    assert 0.5 <= waited == pytest.approx(envmemory.gate_waited(tmp_path, "maxtext-0.2.5"), abs=0.06)
    again = subprocess.run([sys.executable, "-c", ENTER], env=env, capture_output=True, text=True, check=True,
                           timeout=HANG_GUARD_S)  # fmt: skip
    assert float(again.stdout.strip()) < 0.5  # the first one's exit released it
    assert envmemory.gate_waited(tmp_path, "unit") is None  # no heavy phase: no mark


def test_a_gate_that_cannot_be_opened_is_a_typed_error_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(envmemory.GATE_VAR, str(tmp_path / "missing" / "shared.lock"))
    monkeypatch.setenv(envmemory.MARK_VAR, str(tmp_path / "x.heavy"))
    with pytest.raises(InvalidArgumentError) as err:
        envmemory.enter_heavy_phase()
    assert err.value.argument == envmemory.GATE_VAR and "missing" in str(err.value)


def test_outside_a_gated_run_the_heavy_phase_starts_at_once(monkeypatch):
    monkeypatch.delenv(envmemory.GATE_VAR, raising=False)
    monkeypatch.delenv(envmemory.MARK_VAR, raising=False)
    assert envmemory.enter_heavy_phase() == 0.0


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


def test_a_reading_uses_the_kernels_counters_and_counts_shared_pages_once(mocker):
    """No page-table walk (smaps, which holds the sampled process's mmap lock); the figure lies between the tree's
    private memory and its RSS sum, read here from /proc/PID/status (the kernel's own split)."""
    opened = mocker.patch.object(builtins, "open", wraps=builtins.open)
    reading = envmemory.tree_memory_gb(os.getpid())
    assert not [c for c in opened.call_args_list if "smaps" in str(c.args[0])]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines())
    kb = {k: int(status[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssShmem")}
    private_gb, rss_gb = (kb["RssAnon"] + kb["RssShmem"]) / 2**20, kb["VmRSS"] / 2**20
    assert private_gb * 0.9 <= reading <= rss_gb * 1.1


def test_a_reading_below_the_peak_after_the_mark_changes_neither_peak(tmp_path):
    """Before the heavy phase's mark both peaks follow the readings; after it only the overall peak moves, and a
    lower reading moves neither."""
    sampler = _scripted_sampler(tmp_path, [2.0, 5.0, 1.0, 3.0, 7.0, 6.0], mark_after=1.0)
    assert (sampler.light_peak_gb, sampler.peak_gb) == (5.0, 7.0)


def test_the_sampler_keeps_the_highest_reading():
    readings = iter([1.0, 3.5, 2.0] + [0.5] * 100_000)
    read_three = threading.Event()
    count = [0]

    def reader(_pid: int) -> float:
        count[0] += 1
        if count[0] >= 3:
            read_three.set()
        return next(readings)

    with envmemory.PeakSampler(1, interval=0.001, reader=reader) as sampler:
        assert read_three.wait(HANG_GUARD_S)  # the third reading, however slow the machine
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
    assert envmemory.memory_budget_gb() == pytest.approx(0.82 * total, rel=0.02)


def test_an_environment_that_fits_beside_none_but_the_small_ones_starts_first_with_them():
    """The environment "lonely" (15 GB) fits beside no other large one (18 GB budget) but beside the 1-GB ones: it
    starts first, while they are there to fill the room, instead of last and alone; the others keep their order."""
    order = ["long", "medium", "lonely", "kernel-a", "kernel-b"]
    peaks = {"long": 9.0, "medium": 8.0, "lonely": 15.0, "kernel-a": 1.0, "kernel-b": 1.0}
    gate = envmemory.Admission(order, peaks, jobs=3, budget_gb=18.0)
    assert [gate.next(), gate.next(), gate.next()] == ["lonely", "kernel-a", "kernel-b"]
    for name in ("lonely", "kernel-a", "kernel-b"):
        gate.finished(name)
    assert [gate.next(), gate.next(), gate.next()] == ["long", "medium", None]
