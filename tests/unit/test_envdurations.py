"""Recorded durations, cold and warm: the file's round trip, the plan's choice of figure, and the committed record."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from helpers.shipped import ci_matrix
from maxtext_compat.runner import caches
from maxtext_compat.runner import durations as envdurations
from maxtext_compat.runner import running as env_runner
from maxtext_compat.runner.durations import Recorded

REPO = Path(__file__).resolve().parents[2]  # this checkout
names = st.text("abcdefgh-0123456789.", min_size=1, max_size=12)
seconds = st.integers(min_value=0, max_value=100_000).map(float)
maybe = st.none() | seconds
entries = st.builds(Recorded, cold=maybe, warm=maybe).filter(lambda r: r.cold is not None or r.warm is not None)


@given(st.dictionaries(names, entries, max_size=8))
def test_what_is_written_reads_back_figure_for_figure(tmp_path_factory, recorded):
    path = tmp_path_factory.mktemp("d") / "durations.json"
    path.write_text(json.dumps({n: r.as_json() for n, r in recorded.items()}))
    assert envdurations.read(path) == recorded


@given(st.dictionaries(names, entries, max_size=6), st.dictionaries(names, seconds, max_size=6), st.sets(names))
def test_a_write_changes_only_the_figure_of_its_own_case(tmp_path_factory, before, new, cold):
    """Oracle: per name, the cold figure changes only for a cold run, the warm only for a warm one."""
    path = tmp_path_factory.mktemp("d") / "durations.json"
    path.write_text(json.dumps({n: r.as_json() for n, r in before.items()}))
    envdurations.write(path, new, cold=cold)
    after = envdurations.read(path)
    assert set(after) == set(before) | set(new)
    for name in after:
        old = before.get(name, Recorded())
        if name not in new:
            assert after[name] == old
        elif name in cold:
            assert after[name] == Recorded(cold=new[name], warm=old.warm)
        else:
            assert after[name] == Recorded(cold=old.cold, warm=new[name])


@given(entries, st.booleans())
def test_the_plan_takes_the_figure_of_the_case_else_the_one_measured(entry, cold):
    mine, other = (entry.cold, entry.warm) if cold else (entry.warm, entry.cold)
    assert entry.planned(cold) == (mine if mine is not None else other)
    assert entry.longest() == max(s for s in (entry.cold, entry.warm) if s is not None)


def test_older_files_read_as_warm_and_unreadable_entries_are_left_out(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"old": 12, "new": {"cold": 30}, "bad": "x", "neg": -1, "flag": True, "empty": {}}))
    assert envdurations.read(path) == {"old": Recorded(warm=12.0), "new": Recorded(cold=30.0)}
    path.write_text("[1, 2]")
    assert envdurations.read(path) == {}
    assert envdurations.read(tmp_path / "missing.json") == {} and envdurations.read(None) == {}


def test_a_fresh_machine_plans_the_cold_figures_and_shards_always_do(tmp_path, monkeypatch):
    """The scheduler's order on a fresh machine comes from the cold figures: here the environment that is second
    when warm is the longest when cold, and runs first."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"a": {"cold": 100, "warm": 90}, "b": {"cold": 300, "warm": 60}, "c": {"warm": 10}}))
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    fresh = env_runner.expected_durations(path)
    assert fresh == {"a": 100.0, "b": 300.0, "c": 10.0}
    assert env_runner.schedule(["a", "b", "c"], fresh) == ["b", "a", "c"]
    for name in ("a", "b", "c"):  # every cache warm
        (tmp_path / "cc" / "jax-compile" / name).mkdir(parents=True)
        (tmp_path / "cc" / "jax-compile" / name / "entry").write_bytes(b"x")
    warm = env_runner.expected_durations(path)
    assert env_runner.schedule(["a", "b", "c"], warm) == ["a", "b", "c"]
    assert env_runner.expected_durations(path, cold=True) == fresh  # what every shard machine reads alike


def test_the_committed_record_has_both_figures_for_every_environment_make_test_runs():
    recorded = envdurations.read(REPO / env_runner.DURATIONS_FILE)
    assert set(recorded) == set(ci_matrix().environments)
    missing = sorted(n for n, r in recorded.items() if r.cold is None or r.warm is None)
    assert not missing, f"no cold or no warm figure for {missing}: run `maxtext-compat matrix --record-durations`"
