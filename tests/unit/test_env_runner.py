"""The compat test matrix runner: real counts per environment; broken environments fail, never skip."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from unittest import mock

import pytest
from packaging.version import Version

from helpers.shipped import CI_LAYOUT, MATRIX_FILE, REPO, ci_matrix, shipped_matrix
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import EnvironmentSpec, load_matrix, with_environments
from maxtext_compat.report import results as report_results
from maxtext_compat.runner import caches, envs
from maxtext_compat.runner import durations as envdurations
from maxtext_compat.runner import memory as envmemory
from maxtext_compat.runner import running as env_runner

pytestmark = [
    pytest.mark.envs("unit"),  # builds throwaway environments: once per matrix run is enough
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is installed by `make envs`"),
]


def _spec(name: str, *requirements: str) -> EnvironmentSpec:
    return EnvironmentSpec(
        name=name,
        description="test",
        python="3.12",
        maxtext=None,
        requirements=requirements,
        no_deps=(),
        overrides=(),
        exclude_newer="2026-12-01T00:00:00Z",
        env={},
        serving=False,
    )


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENVS_DIR_VAR, str(tmp_path / "envs"))
    m = shipped_matrix()
    specs = {s.name: s for s in (_spec("tiny", "six==1.17.0"), _spec("broken", "six==999.0"))}
    return dataclasses.replace(m, environments=specs)


def test_an_environment_that_fails_to_build_fails_the_run(matrix, tmp_path):
    results = env_runner.run_matrix(["broken"], matrix=matrix, report_dir=tmp_path / "build", log=lambda _: None)
    (r,) = results
    assert r.status == "build-failed" and not r.ok and "six" in r.detail
    assert report_results.main_exit_code(results) == 1
    assert report_results.closing_line(results) == "compat-matrix: 0 passed, 1 failed, 0 skipped"
    data = json.loads((tmp_path / "build" / "compat-report.json").read_text())
    assert data["envs"][0]["status"] == "build-failed"
    assert data["run"]["claims"] is True and data["run"]["matrix"]  # run from this checkout: its claims hold
    assert "build-failed" in (tmp_path / "build" / "compat-report.md").read_text()


def test_counts_come_from_the_real_run_and_skips_are_not_passes(matrix, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skipped(): pass\n"
    )
    results = env_runner.run_matrix(
        ["tiny"], matrix=matrix, report_dir=tmp_path / "build", pytest_args=[str(suite), "-q"], log=lambda _: None
    )
    (r,) = results
    assert (r.passed, r.failed, r.skipped) == (1, 1, 1)
    assert r.status == "failed"
    assert report_results.closing_line(results) == "compat-matrix: 1 passed, 1 failed, 1 skipped"
    env = json.loads((tmp_path / "build" / "compat-report.json").read_text())["envs"][0]
    assert {"name", "versions", "passed", "failed", "skipped", "duration_s"} <= set(env)
    assert env["name"] == "tiny" and env["duration_s"] > 0


def test_test_processes_write_bytecode_outside_the_tree_even_where_the_machine_forbids_it(
    matrix, tmp_path, monkeypatch
):
    """CI sets PYTHONDONTWRITEBYTECODE: without this every process compiles vllm and torch from source again."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    prefix = tmp_path / "cc" / caches.PYCACHE
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_x.py").write_text(
        "import os, sys\n"
        "def test_bytecode():\n"
        "    import six\n"
        "    assert not sys.dont_write_bytecode and 'PYTHONDONTWRITEBYTECODE' not in os.environ\n"
        f"    assert sys.pycache_prefix == {str(prefix)!r}\n"
    )
    (r,) = env_runner.run_matrix(
        ["tiny"], matrix=matrix, report_dir=tmp_path / "build", pytest_args=[str(suite), "-q"], log=lambda _: None
    )
    assert (r.status, r.passed) == ("ok", 1), (tmp_path / "build" / "logs").glob("*")
    assert any(p.name.startswith("six.") for p in prefix.rglob("*.pyc"))  # an installed package, compiled once
    assert not list((tmp_path / "envs").rglob("six.*.pyc"))  # nothing written inside the environment


def test_a_run_records_whether_its_compilation_cache_was_cold_and_the_next_plan_reads_it(matrix, tmp_path, monkeypatch):
    """The first run finds the environment's cache empty (cold), fills it as a compile would; the second is warm.
    Each is recorded under its own figure and the plan then follows the cache's state."""
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_x.py").write_text(
        "import os, pathlib, time\n"
        "def test_compiles():\n"
        "    folder = pathlib.Path(os.environ['JAX_COMPILATION_CACHE_DIR'])\n"
        "    folder.mkdir(parents=True, exist_ok=True)\n"
        "    if not (folder / 'entry').exists():\n"
        "        time.sleep(3)  # the compile the cache saves next time\n"
        "    (folder / 'entry').write_bytes(b'x')\n"
    )
    durations = tmp_path / "durations.json"
    seen = []
    for _ in range(2):
        (r,) = env_runner.run_matrix(
            ["tiny"], matrix=matrix, report_dir=tmp_path / "build", pytest_args=[str(suite), "-q"], log=lambda _: None
        )
        assert r.status == "ok"
        seen.append(r.cold_cache)
        env_runner.record_durations([r], durations)
        report = json.loads((tmp_path / "build" / "compat-report.json").read_text())
        assert report["envs"][0]["cold_cache"] is r.cold_cache
    assert seen == [True, False]
    recorded = envdurations.read(durations)["tiny"]
    assert recorded.cold is not None and recorded.warm is not None and recorded.cold > recorded.warm
    assert env_runner.expected_durations(durations) == {"tiny": recorded.warm}  # its cache is warm now
    assert env_runner.expected_durations(durations, cold=True) == {"tiny": recorded.cold}
    assert env_runner.longest_durations(durations) == {"tiny": recorded.cold}
    shutil.rmtree(tmp_path / "cc" / "jax-compile" / "tiny")
    assert env_runner.expected_durations(durations) == {"tiny": recorded.cold}  # emptied: planned cold again


def test_an_environment_is_cold_by_its_cache_when_the_run_began_not_when_it_starts(matrix, tmp_path, monkeypatch):
    """A partner process of one environment (the cross-era and paths tests start one in another environment) may
    fill that environment's cache before its own turn: it still ran cold, and is recorded so."""
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    two = dataclasses.replace(matrix, environments={"tiny": matrix.environments["tiny"], "other": _spec("other")})
    seen: dict[str, bool | None] = {}

    def fake_run_env(name, *, cold_cache=None, **_kwargs):
        seen[name] = cold_cache
        if name == "tiny":  # its partner compiles in the other environment's cache
            folder = caches.compile_cache_dir("other")
            folder.mkdir(parents=True)
            (folder / "jit_partner-cache").write_bytes(b"x")
        return report_results.EnvResult(name=name, maxtext=None, passed=1, cold_cache=bool(cold_cache))

    monkeypatch.setattr(env_runner, "run_env", fake_run_env)
    for jobs in (1, 2):
        shutil.rmtree(tmp_path / "cc", ignore_errors=True)
        seen.clear()
        env_runner.run_matrix(["tiny", "other"], matrix=two, report_dir=tmp_path / "b", jobs=jobs, log=lambda _: None)
        assert seen == {"tiny": True, "other": True}, jobs
    env_runner.run_matrix(["other"], matrix=two, report_dir=tmp_path / "b", log=lambda _: None)
    assert seen["other"] is False  # the next run finds the entry: warm


def test_an_earlier_runs_heavy_marks_are_gone_before_any_environment_starts(matrix, tmp_path, monkeypatch):
    """The scheduler reads NAME.heavy as "NAME holds the gate now": a mark left in the same report folder by an
    earlier run would count a running environment's heavy excess before its heavy phase."""
    gate = tmp_path / "b" / "heavy-gate"
    gate.mkdir(parents=True)
    stale = [envmemory.heavy_mark(gate, n) for n in ("tiny", "gone")]
    for mark in stale:
        mark.write_text("3.0\n", encoding="ascii")
    seen: list[bool] = []

    def fake_run_env(name, **_kwargs):
        seen.append(any(mark.exists() for mark in stale))
        return report_results.EnvResult(name=name, maxtext=None, passed=1)

    monkeypatch.setattr(env_runner, "run_env", fake_run_env)
    env_runner.run_matrix(["tiny"], matrix=matrix, report_dir=tmp_path / "b", log=lambda _: None)
    assert seen == [False]


@pytest.mark.parametrize(("compile_cache", "xdg"), [(None, None), (None, "xdg"), ("cc", None), ("cc", "xdg")])
def test_make_demo_compiles_modules_where_the_test_runs_do(compile_cache, xdg, tmp_path):
    """The Makefile's PYTHONPYCACHEPREFIX (make demo) and env_runner's (make test) are the same folder."""
    if shutil.which("make") is None:
        pytest.fail("make is what the README's two commands run: it must be installed")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "XDG_CACHE_HOME")}
    env.pop(caches.COMPILE_CACHE_VAR, None)
    if compile_cache:
        env[caches.COMPILE_CACHE_VAR] = str(tmp_path / compile_cache)
    if xdg:
        env["XDG_CACHE_HOME"] = str(tmp_path / xdg)
    show = "print-pycache: ; @echo $$PYTHONPYCACHEPREFIX"
    made = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "--eval", show, "print-pycache"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    with mock.patch.dict(os.environ, env, clear=True):
        assert made == caches.bytecode_cache_env()["PYTHONPYCACHEPREFIX"]


def test_a_hung_environment_is_stopped_with_everything_it_started(matrix, tmp_path, monkeypatch):
    suite = tmp_path / "hang"
    suite.mkdir()
    pid_file = tmp_path / "child.pid"
    (suite / "test_hang.py").write_text(
        "import subprocess, sys, time\n"
        "def test_hangs():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(10**6)'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(10**6)\n"
    )
    monkeypatch.setenv(env_runner.TIMEOUT_VAR, "20")
    (r,) = env_runner.run_matrix(
        ["tiny"], matrix=matrix, report_dir=tmp_path / "build", pytest_args=[str(suite)], log=lambda _: None
    )
    # The test sleeps 10**6 s: that run_matrix returned at all is the proof it did not wait for it (no wall clock)
    assert r.status == "timeout" and not r.ok and env_runner.TIMEOUT_VAR in r.detail
    child = int(pid_file.read_text())
    while _alive(child):
        time.sleep(0.05)  # SIGKILL was sent to the group: the grandchild is going (the suite's timeout guards a hang)


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its parent to reap it has stopped)."""
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan", "inf", "1e400", "1e9"])
def test_a_timeout_that_is_not_seconds_is_refused(monkeypatch, value):
    monkeypatch.setenv(env_runner.TIMEOUT_VAR, value)
    with pytest.raises(InvalidArgumentError, match=env_runner.TIMEOUT_VAR) as e:
        env_runner.env_timeout("maxtext-0.2.5")
    assert repr(value) in str(e.value)


def test_the_timeout_follows_the_recorded_time(monkeypatch):
    monkeypatch.delenv(env_runner.TIMEOUT_VAR, raising=False)
    recorded = envdurations.read(REPO / env_runner.DURATIONS_FILE)["maxtext-0.2.5"]
    longest = max(s for s in (recorded.cold, recorded.warm) if s is not None)
    assert env_runner.env_timeout("maxtext-0.2.5") == max(1800.0, 4 * longest)
    assert env_runner.env_timeout("not-recorded") == 3600.0


def test_an_environment_that_runs_no_test_fails(matrix, tmp_path):
    suite = tmp_path / "empty"
    suite.mkdir()
    (suite / "test_none.py").write_text("x = 1\n")
    (r,) = env_runner.run_matrix(
        ["tiny"], matrix=matrix, report_dir=tmp_path / "build", pytest_args=[str(suite)], log=lambda _: None
    )
    assert r.status == "no-tests" and not r.ok


def test_report_lists_the_rows_covered_only_by_mocks(tmp_path):
    real = ci_matrix()
    assert report_results.mocked_rows(real) == []  # every MaxText release has a real environment
    # Without the 0.2.x environments but 0.2.5's, releases 0.2.0-0.2.4 would be covered by mocks only.
    envs = {
        k: v for k, v in real.environments.items() if not (v.maxtext or "").startswith("0.2.") or k == "maxtext-0.2.5"
    }
    fewer = dataclasses.replace(real, environments=envs)
    mocked = report_results.mocked_rows(fewer)
    assert mocked == ["0.2.0", "0.2.1", "0.2.2", "0.2.3", "0.2.4"]
    report_results.write_reports([], fewer, tmp_path)
    data = json.loads((tmp_path / "compat-report.json").read_text())
    assert [r["maxtext"] for r in data["mocked_rows"]] == mocked
    report = (tmp_path / "compat-report.md").read_text()
    assert "MaxText 0.2.3: pytest-mock tests" in report and "None:" not in report
    # A run that makes no claims (a user's project on the pin sets) says nothing about rows it did not run.
    report_results.write_reports([], fewer, tmp_path, claims=False)
    data = json.loads((tmp_path / "compat-report.json").read_text())
    assert data["run"]["claims"] is False and data["mocked_rows"] == data["mocked_tpu_inference_rows"] == []
    assert "mocked" not in (tmp_path / "compat-report.md").read_text()
    report_results.write_reports([], real, tmp_path)
    report = (tmp_path / "compat-report.md").read_text()
    assert report.rstrip().endswith(
        f"None: each of the {len(real.maxtext)} MaxText rows and {len(real.tpu_inference)} tpu-inference ranges is "
        "installed by an environment of the matrix."
    )


def test_report_lists_the_tpu_inference_ranges_no_env_installs(tmp_path):
    real = ci_matrix()
    assert report_results.mocked_tpu_inference_rows(real) == []  # every range runs its real kernel somewhere
    # Without the 0.11.1 environment (and with the row's reason), its range would be covered by mocks only.
    envs = {k: v for k, v in real.environments.items() if k != "tpu-inference-0.11.1"}
    rows = tuple(
        dataclasses.replace(r, not_real="no wheel here") if r.label == ">=0.11.1,<0.12.0" else r
        for r in real.tpu_inference
    )
    fewer = dataclasses.replace(real, environments=envs, tpu_inference=rows)
    ranges = report_results.mocked_tpu_inference_rows(fewer)
    assert ranges == [">=0.11.1,<0.12.0"]
    report_results.write_reports([], fewer, tmp_path)
    data = json.loads((tmp_path / "compat-report.json").read_text())
    assert data["mocked_tpu_inference_rows"] == [
        {"tpu_inference": ">=0.11.1,<0.12.0", "covered_by": report_results.MOCKED_TPU_INFERENCE, "why": "no wheel here"}
    ]
    report = (tmp_path / "compat-report.md").read_text()
    assert "- tpu-inference >=0.11.1,<0.12.0: pytest-mock tests" in report and "no wheel here" in report


def test_the_cpu_shims_verified_tpu_inference_releases_are_those_the_kernel_tests_run_on():
    """verified_tpu_inference is a fact about the suite: the releases installed where the real kernel runs."""
    from helpers.kernel_envs import REAL_KERNEL_ENVS

    real = ci_matrix()
    pinned = {report_results.pinned_version(real.environment(name), "tpu-inference") for name in REAL_KERNEL_ENVS}
    assert sorted(pinned, key=Version) == list(real.cpu_shim.verified_tpu_inference)


def test_the_cpu_shims_verified_jax_is_every_jax_the_kernel_tests_run_on_and_covers_every_release_pin():
    """verified_jax is a fact about the suite: each listed jax has an environment where the real kernel runs
    through the CPU shim, and each jax a tpu-inference release pins is listed (its release runs on CPU)."""
    from helpers.kernel_envs import REAL_KERNEL_ENVS

    real = ci_matrix()
    tested = {report_results.pinned_version(real.environment(name), "jax") for name in REAL_KERNEL_ENVS}
    assert None not in tested, "a kernel environment leaves its jax unpinned"
    assert sorted(tested, key=Version) == list(real.cpu_shim.verified_jax)
    release_pins = {rel.jax for row in real.tpu_inference for rel in row.releases.values()}
    assert release_pins <= set(real.cpu_shim.verified_jax), sorted(release_pins - set(real.cpu_shim.verified_jax))


def test_the_kernel_tests_run_once_per_tpu_inference_and_jax():
    """The kernel tests exercise tpu-inference and jax, not MaxText: a second environment with the same two
    pins would only repeat them (they cost minutes per environment in interpret mode)."""
    from helpers.kernel_envs import REAL_KERNEL_ENVS

    real = ci_matrix()
    pins = {}
    for name in REAL_KERNEL_ENVS:
        env = real.environment(name)
        pins.setdefault(
            (report_results.pinned_version(env, "tpu-inference"), report_results.pinned_version(env, "jax")), []
        ).append(name)
    assert not {pair: names for pair, names in pins.items() if len(names) > 1}


def test_every_range_no_environment_installs_says_why_and_no_real_range_does():
    """`not_real:` is the report's one line per mocked range: missing there, or stale on a range an
    environment now installs, is a wrong fact."""
    real = ci_matrix()
    mocked = set(report_results.mocked_tpu_inference_rows(real))
    for row in real.tpu_inference:
        assert bool(row.not_real) == (row.label in mocked), (row.label, row.not_real)


def test_not_real_must_be_a_nonempty_string(tmp_path):
    from maxtext_compat.errors import MatrixError

    text = (REPO / "compat_matrix.yaml").read_text()
    bad = re.sub(r"(?m)^(    block_sizes: \[tuned\]\n)", r"\1    not_real: ''\n", text, count=1)
    assert bad != text
    (tmp_path / "m.yaml").write_text(bad)
    with pytest.raises(MatrixError, match="not_real"):
        load_matrix(tmp_path / "m.yaml")


@pytest.mark.parametrize(
    "tests", ["[../outside.py]", "[/abs/tests/x.py]", "[tests/notes.txt]", "[tests/../x.py]", "[]", "tests/x.py"]
)
def test_an_environments_test_files_are_test_files_of_this_repository(tmp_path, tests):
    from maxtext_compat.errors import MatrixError

    text = CI_LAYOUT.read_text()
    bad = text.replace("    tests: &kernel_tests [tests/compat/test_paged_rpa.py, tests/compat/test_cpu_rpa_shim.py]",
                       f"    tests: {tests}", 1)  # fmt: skip
    bad = bad.replace("    tests: *kernel_tests", "    tests: [tests/compat/test_paged_rpa.py]")
    assert bad != text
    (tmp_path / "environments.yaml").write_text(bad)
    with pytest.raises(MatrixError, match="tests") as e:
        with_environments(load_matrix(MATRIX_FILE), tmp_path / "environments.yaml")
    assert "Fix:" in str(e.value) and str(tmp_path / "environments.yaml") in str(e.value)


def test_an_environment_that_lists_test_files_runs_only_those():
    real = ci_matrix()
    spec = real.environment("tpu-inference-0.22.1")
    assert spec.maxtext is None
    assert spec.tests == ("tests/compat/test_paged_rpa.py", "tests/compat/test_cpu_rpa_shim.py")
    assert spec.as_dict()["tests"] == list(spec.tests)
    assert "tests" not in real.environment("maxtext-0.2.5").as_dict()  # the whole suite; its spec hash unchanged


def test_schedule_starts_the_longest_recorded_environment_first():
    names = ["unit", "a", "b", "c"]
    # c is unknown (may be long: first), then by recorded seconds, ties in matrix order
    assert env_runner.schedule(names, {"unit": 100.0, "a": 5.0, "b": 900.0}) == ["c", "b", "unit", "a"]
    assert env_runner.schedule(names, {}) == names


def test_recorded_durations_are_read_leniently_and_cover_every_real_environment(tmp_path):
    assert env_runner.expected_durations(tmp_path / "missing.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert env_runner.expected_durations(bad) == {}
    recorded = env_runner.expected_durations(REPO / env_runner.DURATIONS_FILE)
    assert set(recorded) == set(ci_matrix().environments)


def test_environments_of_one_jaxlib_share_a_compile_cache_and_no_other_does(monkeypatch, tmp_path):
    """JAX's entry key holds jaxlib's version and the whole program, so a folder shared by one jaxlib's environments
    serves each the programs another compiled (the same tiny model under two MaxText releases) and nothing else."""
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    m = ci_matrix()
    folders: dict[Path, set[str]] = {}
    for name, spec in m.environments.items():
        folder = caches.compile_cache_dir(name, m)
        assert folder is not None and folder.parent == tmp_path / "cc" / "jax-compile"
        assert caches.compile_cache_env(name, m)["JAX_COMPILATION_CACHE_DIR"] == str(folder)
        # the oracle: the jaxlib each installs, read from its own pins (jax's where jaxlib is not named)
        folders.setdefault(folder, set()).add(spec.pinned("jaxlib") or spec.pinned("jax") or f"none:{name}")
    assert all(len(jaxlibs) == 1 for jaxlibs in folders.values()), folders
    assert len(folders) == len({next(iter(j)) for j in folders.values()})  # one folder per jaxlib
    shared = caches.compile_cache_dir("maxtext-0.2.5", m)
    assert shared == caches.compile_cache_dir("maxtext-0.1.0-jax011", m) and shared.name == "jaxlib-0.11.2"
    assert caches.compile_cache_dir("unit", m).name == "unit"  # no jaxlib: a folder of its own
    assert caches.compile_cache_dir("not-in-the-matrix", m).name == "not-in-the-matrix"
    # cold or warm is read from the shared folder: an entry another environment wrote makes this one warm
    assert caches.cache_is_cold("maxtext-0.2.4", m)
    shared.mkdir(parents=True)
    (shared / "jit_step-0123-cache").write_bytes(b"x")
    assert not caches.cache_is_cold("maxtext-0.2.4", m) and caches.cache_is_cold("maxtext-0.2.1", m)


def test_a_cache_is_cold_until_it_holds_an_entry(monkeypatch, tmp_path):
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    folder = tmp_path / "cc" / "jax-compile" / "unit"
    assert caches.cache_is_cold("unit")  # missing
    (folder / "sub").mkdir(parents=True)
    assert caches.cache_is_cold("unit")  # folders alone are no entries
    (folder / "sub" / "jit_f-1234").write_bytes(b"x")
    assert not caches.cache_is_cold("unit")
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, "")
    assert caches.cache_is_cold("unit")  # caches turned off


def test_compile_cache_lives_outside_the_tree_and_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    env = caches.compile_cache_env("maxtext-0.2.5")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cc" / "jax-compile" / "maxtext-0.2.5")
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, "")
    assert caches.compile_cache_env("maxtext-0.2.5") == {}
    monkeypatch.delenv(caches.COMPILE_CACHE_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.compile_cache_env("x")["JAX_COMPILATION_CACHE_DIR"].startswith(str(tmp_path / "xdg"))
    assert caches.compile_cache_env("x")["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(1 << 30)  # JAX keeps it LRU


def test_cache_entries_unused_for_two_weeks_are_pruned_and_nothing_else(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, str(tmp_path / "cc"))
    assert caches.prune_unused_caches() == []  # no folders yet
    now = 1_800_000_000.0
    ages = {"fresh": 0.0, "a-week": 7 * 86400.0, "stale": 15 * 86400.0}
    folders = {caches.PARTNER_ANSWERS: ".npz", caches.HF_REFERENCE: ".safetensors"}
    for folder, suffix in folders.items():
        (tmp_path / "cc" / folder).mkdir(parents=True)
        others = [("stale.other", 30 * 86400.0), (f"stale{suffix}.1234.partial", 15 * 86400.0)]
        others.append((f"fresh{suffix}.1234.partial", 0.0))  # a write in progress
        for name, age in [*((n + suffix, a) for n, a in ages.items()), *others]:
            f = tmp_path / "cc" / folder / name
            f.write_bytes(b"x")
            os.utime(f, (now - age, now - age))
    pruned = caches.prune_unused_caches(now=now)
    assert sorted(f"{p.parent.name}/{p.name}" for p in pruned) == [
        "era-partner/stale.npz",
        "era-partner/stale.npz.1234.partial",
        "hf-reference/stale.safetensors",
        "hf-reference/stale.safetensors.1234.partial",
    ]
    for folder, suffix in folders.items():  # entries of another kind are not ours
        assert sorted(p.name for p in (tmp_path / "cc" / folder).iterdir()) == sorted(
            ["a-week" + suffix, "fresh" + suffix, f"fresh{suffix}.1234.partial", "stale.other"]
        )
    assert caches.hf_reference_dir() == tmp_path / "cc" / "hf-reference"
    monkeypatch.setenv(caches.COMPILE_CACHE_VAR, "")
    assert caches.prune_unused_caches(now=now + 10**9) == [] and caches.hf_reference_dir() is None


@pytest.mark.parametrize("jobs", [0, -1, 2.5, True, "2"])
def test_jobs_must_be_a_positive_whole_number(matrix, tmp_path, jobs):
    with pytest.raises(InvalidArgumentError, match=r"\[jobs\] jobs must be >= 1.*Found: "):
        env_runner.run_matrix(["tiny"], matrix=matrix, report_dir=tmp_path, jobs=jobs, log=lambda _: None)


def test_a_build_failure_with_jobs_is_reported_like_without(matrix, tmp_path):
    # The parallel path must record a broken build per environment, not abort the run.
    results = env_runner.run_matrix(
        ["broken", "tiny"],
        matrix=matrix,
        report_dir=tmp_path / "build",
        pytest_args=["--version"],
        log=lambda _: None,
        jobs=2,
    )
    broken, tiny = results
    assert broken.status == "build-failed" and "six" in broken.detail
    assert tiny.name == "tiny" and tiny.status != "build-failed"
    assert report_results.main_exit_code(results) == 1


def test_parallel_environments_really_overlap_and_each_logs_to_its_own_file(matrix, tmp_path, monkeypatch):
    """Each environment's test waits for the other's to start: it passes only if both run at once.

    Found: a 120 s deadline on that wait ran out in a make test on a loaded 2-core machine (the other
    environment's pytest had not started yet), so the wait now has none: it ends on the other's flag, an event.
    The hang guard is the runner's own timeout (a runner that never started the second environment would end
    the first as `timeout` instead of hanging the suite); a correct runner never comes near it."""
    monkeypatch.setenv(env_runner.TIMEOUT_VAR, "1800")
    specs = dict(matrix.environments, tiny2=_spec("tiny2", "six==1.17.0"))
    m = dataclasses.replace(matrix, environments=specs)
    suite = tmp_path / "suite"
    suite.mkdir()
    flags = tmp_path / "flags"
    flags.mkdir()
    (suite / "test_meet.py").write_text(
        "import os, pathlib, time\n"
        f"FLAGS = pathlib.Path({str(flags)!r})\n"
        "def test_meet():\n"
        "    me = os.environ['MAXTEXT_COMPAT_ENV']\n"
        "    other = {'tiny': 'tiny2', 'tiny2': 'tiny'}[me]\n"
        "    (FLAGS / me).write_text('x')\n"
        "    while not (FLAGS / other).exists():  # no deadline: the runner's timeout guards a hang\n"
        "        time.sleep(0.05)\n"
        "    print('MET', me)\n"
    )
    (suite / "test_fail.py").write_text(
        "import os\n"
        "def test_only_tiny2_fails():\n"
        "    assert os.environ['MAXTEXT_COMPAT_ENV'] != 'tiny2', 'FAILS-IN-TINY2'\n"
    )
    lines: list[str] = []
    results = env_runner.run_matrix(
        ["tiny", "tiny2"],
        matrix=m,
        report_dir=tmp_path / "build",
        pytest_args=[str(suite), "-q", "-s"],
        log=lines.append,
        jobs=2,
    )
    assert [r.name for r in results] == ["tiny", "tiny2"]  # report in matrix order whatever finished first
    assert (results[0].passed, results[0].failed) == (2, 0) and results[0].ok
    assert (results[1].passed, results[1].failed) == (1, 1) and not results[1].ok
    for name in ("tiny", "tiny2"):
        assert f"MET {name}" in (tmp_path / "build" / "logs" / f"{name}.log").read_text()
    console = "\n".join(lines)
    assert "FAILS-IN-TINY2" in console  # a failing environment's log tail reaches the console
    assert "tiny: ok, 2 passed" in console


def test_record_durations_keeps_other_environments_and_skips_failed_runs(tmp_path):
    f = tmp_path / "d.json"
    f.write_text('{"a": 10, "b": 20, "c": {"warm": 5}}')
    ok = report_results.EnvResult(name="b", maxtext=None, passed=1, duration_s=33.4)
    cold = report_results.EnvResult(name="c", maxtext=None, passed=1, duration_s=70.6, cold_cache=True)
    bad = report_results.EnvResult(name="a", maxtext=None, failed=1, duration_s=1.0, status="failed")
    env_runner.record_durations([ok, cold, bad], f)
    assert json.loads(f.read_text()) == {"a": {"warm": 10}, "b": {"warm": 33}, "c": {"cold": 71, "warm": 5}}


def test_a_run_splits_its_peak_at_the_heavy_phase_and_records_both(matrix, tmp_path):
    """The environment's test process marks its heavy phase (enter_heavy_phase, the lock file the runner hands it);
    the runner's sampler records the peak before the mark as the light peak, and record_durations writes both."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_x.py").write_text(
        "import time\n"
        "from maxtext_compat.runner import memory as envmemory\n"
        "def hold(mb):\n"
        "    held = bytearray(mb * 2**20)\n"
        "    held[::4096] = b'x' * len(held[::4096])\n"
        "    time.sleep(2.5)  # the sampler reads every second\n"
        "def test_1_light():\n"
        "    hold(300)\n"
        "def test_2_heavy():\n"
        "    assert envmemory.enter_heavy_phase() < 1.0\n"
        "    hold(1000)\n"
    )
    (r,) = env_runner.run_matrix(
        ["tiny"], matrix=matrix, report_dir=tmp_path / "build", pytest_args=[str(suite), "-q"], log=lambda _: None
    )
    assert r.status == "ok" and r.passed == 2
    assert r.light_peak_gb >= 0.3 and r.peak_memory_gb - r.light_peak_gb >= 0.5, (r.light_peak_gb, r.peak_memory_gb)
    assert r.gate_wait_s < 1.0
    durations = tmp_path / "records" / "env_durations.json"
    durations.parent.mkdir()
    env_runner.record_durations([dataclasses.replace(r, gate_wait_s=2.0)], durations)
    light = json.loads((tmp_path / "records" / "env_memory_light.json").read_text())
    assert light == {"tiny": pytest.approx(r.light_peak_gb, abs=0.1)}
    assert envdurations.read(durations)["tiny"].longest() == pytest.approx(r.duration_s - 2.0, abs=1.0)  # not the wait
