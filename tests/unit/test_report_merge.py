"""Results of many machines joined into one report, and the shards that produce them.

The results folders are written by the real writer (report.results.write_reports) from results of real shape; no
environment runs here. The oracle for a merge is the report one machine writes from all the results at once.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import load_matrix
from maxtext_compat.report.grid import build_grid
from maxtext_compat.report.merge import merge
from maxtext_compat.report.results import EnvResult, write_reports
from maxtext_compat.runner import pinsets
from maxtext_compat.runner import running as env_runner

pytestmark = pytest.mark.envs("unit")

MATRIX = load_matrix()
M = dataclasses.replace(MATRIX, environments=dict(MATRIX.pin_sets))  # a user's project: the pin sets
NAMES = list(M.environments)


def _result(name: str, i: int) -> EnvResult:
    spec = M.environment(name)
    return EnvResult(name=name, maxtext=spec.maxtext, versions={"maxtext": spec.maxtext or "", "jax": "0.11.2"},
                     passed=3 + i, failed=i % 2, skipped=i % 3, duration_s=10.0 + i,
                     status="failed" if i % 2 else "ok", detail="")  # fmt: skip


def _write(folder, names, run):
    results = [_result(n, NAMES.index(n)) for n in names]
    (folder / "junit").mkdir(parents=True)
    for r in results:
        (folder / "junit" / f"{r.name}.xml").write_text(
            f'<testsuite name="pytest" tests="{r.passed}"><testcase classname="t" name="x"/></testsuite>',
            encoding="utf-8",
        )
    write_reports(results, M, folder, claims=False, run=run, screenshot=False)
    return json.loads((folder / "compat-report.json").read_text(encoding="utf-8"))


def _run(selected, **extra):
    return {"project": "mylayer", "selected": selected, **extra}


def _cells(data):
    return {k: (c.state, [e.name for e in c.envs]) for k, c in build_grid(data, M).cells.items()}


def test_shards_merged_equal_the_single_report(tmp_path):
    single = _write(tmp_path / "single", NAMES, _run(NAMES))
    folders = []
    for k in (1, 2, 3):
        mine = env_runner.shard(NAMES, k, 3)
        folders.append(tmp_path / f"shard-{k}")
        _write(folders[-1], mine, _run(NAMES, shard=f"{k}/3"))
    logs: list[str] = []
    merge(folders, tmp_path / "merged", M, screenshot=False, log=logs.append)
    merged = json.loads((tmp_path / "merged" / "compat-report.json").read_text(encoding="utf-8"))
    assert [e["name"] for e in merged["envs"]] == NAMES  # the run's order, not the shards'
    assert merged["envs"] == single["envs"]
    assert _cells(merged) == _cells(single)
    assert merged["run"]["missing"] == [] and merged["run"]["merged_from"] == 3 and not logs
    assert sorted(p.name for p in (tmp_path / "merged" / "junit").iterdir()) == sorted(f"{n}.xml" for n in NAMES)
    md = (tmp_path / "merged" / "compat-report.md").read_text(encoding="utf-8")
    assert md == (tmp_path / "single" / "compat-report.md").read_text(encoding="utf-8")


def test_a_missing_shard_is_said_and_shown_not_run(tmp_path):
    _write(tmp_path / "a", env_runner.shard(NAMES, 1, 2), _run(NAMES, shard="1/2"))
    logs: list[str] = []
    merge([tmp_path / "a"], tmp_path / "out", M, screenshot=False, log=logs.append)
    missing = env_runner.shard(NAMES, 2, 2)
    data = json.loads((tmp_path / "out" / "compat-report.json").read_text(encoding="utf-8"))
    assert data["run"]["missing"] == missing and any(all(n in line for n in missing) for line in logs), logs
    states = {chip.name: chip.state for cell in build_grid(data, M).cells.values() for chip in cell.envs}
    assert all(states[n] == "not-run" for n in missing), states


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"matrix": "0" * 16}, "matrix"),
        ({"maxtext_compat": "9.9.9"}, "maxtext_compat"),
        ({"project": "other"}, "project"),
        ({"selected": NAMES[:2]}, "selected"),
    ],
)
def test_results_of_another_run_are_refused(tmp_path, change, words):
    _write(tmp_path / "a", NAMES[:1], _run(NAMES))
    _write(tmp_path / "b", NAMES[1:2], _run(NAMES))
    doc = json.loads((tmp_path / "b" / "compat-report.json").read_text(encoding="utf-8"))
    doc["run"].update(change)
    (tmp_path / "b" / "compat-report.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(InvalidArgumentError) as err:
        merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out", M, screenshot=False)
    assert err.value.argument == "--merge" and words in str(err.value) and str(tmp_path / "b") in str(err.value)
    assert not (tmp_path / "out" / "compat-report.json").exists()  # nothing written


def test_one_environment_in_two_folders_is_refused(tmp_path):
    _write(tmp_path / "a", NAMES[:2], _run(NAMES))
    _write(tmp_path / "b", NAMES[1:3], _run(NAMES))
    with pytest.raises(InvalidArgumentError, match=f"{NAMES[1]!r} has results in two folders"):
        merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out", M, screenshot=False)


def test_results_drawn_with_another_matrix_than_ours_are_refused(tmp_path):
    _write(tmp_path / "a", NAMES[:1], _run(NAMES, matrix="f" * 16))
    with pytest.raises(InvalidArgumentError, match="another compat matrix") as err:
        merge([tmp_path / "a"], tmp_path / "out", M, screenshot=False)
    assert pinsets.fingerprint(M) in str(err.value)


@pytest.mark.parametrize("content", [None, "not json", "[1, 2]", '{"envs": []}'])
def test_a_folder_without_our_results_is_refused(tmp_path, content):
    (tmp_path / "a").mkdir()
    if content is not None:
        (tmp_path / "a" / "compat-report.json").write_text(content, encoding="utf-8")
    with pytest.raises(InvalidArgumentError) as err:
        merge([tmp_path / "a"], tmp_path / "out", M, screenshot=False)
    assert err.value.argument == "--merge" and str(tmp_path / "a") in str(err.value)


@given(
    names=st.lists(st.text("abcdefgh", min_size=1, max_size=6), unique=True, max_size=12),
    parts=st.integers(1, 6),
    durations=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6), st.floats(0, 1e4), max_size=8),
)
def test_shards_cover_the_selection_exactly_once_in_its_order(names, parts, durations):
    shards = [env_runner.shard(names, k, parts, durations) for k in range(1, parts + 1)]
    flat = [n for s in shards for n in s]
    assert sorted(flat) == sorted(names)  # every name once
    for s in shards:
        assert s == [n for n in names if n in s]  # the selection's order within a shard
    if len(names) >= parts:
        assert all(shards)  # no machine idles while another has two


@pytest.mark.parametrize(("part", "parts"), [(0, 2), (3, 2), (1, 0), (-1, 2)])
def test_a_shard_outside_the_run_is_refused(part, parts):
    with pytest.raises(InvalidArgumentError, match="K/N with 1 <= K <= N") as err:
        env_runner.shard(NAMES, part, parts)
    assert err.value.argument == "--shard" and err.value.found == f"{part}/{parts}"
