"""The compat matrix as another team runs it: a project of its own, outside this checkout, with our wheel pip-installed.

One throw-away project (its own package calling MaxText's Attention the old way, its tests on the pytest plugin's
fixtures) is run over MaxText 0.1.0 and 0.2.5 four ways, each from the wheel installed in the project's own venv:
`maxtext-compat matrix`; the commands of the GitHub Actions workflow we ship (docs/ci/compat-matrix.yml), one
shard per job in its own process and folder, joined by `report --merge`; `maxtext-compat pins` followed by plain uv;
and nox through `maxtext_compat.runner.nox`. Each way must find the same packages and the same results.

Runs in the unit environment (Python 3.11, no MaxText of its own): every MaxText here is one the wheel installs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.envs("unit"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "docs" / "ci" / "compat-matrix.yml"
RELEASES = ("0.1.0", "0.2.5")
SETS = tuple(f"maxtext-{r}" for r in RELEASES)
TESTS_PER_ENV = 3  # the README's recipe 3 test file, and two tests of the project's own layer


def _readme_recipe() -> tuple[str, str, str]:
    """README recipe 3: (its test file, the command, the closing line it shows)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- recipe: matrix (tests/unit/test_downstream_project.py runs")
    test_file, commands = re.findall(r"```[a-z]*\n(.*?)```", readme[start : readme.index("\n## ", start)], re.S)[:2]
    command, shown = commands.strip().splitlines()
    return test_file, command, shown.lstrip("# .")


PACKAGE = '''\
"""A downstream layer on MaxText: it calls Attention the old way and wants one array back, on any release."""

from maxtext_compat.adapters import wrap


def attend(attention, x, positions):
    """Self-attention over `x` by MaxText's Attention, called as before PR #2616: `out = attention(...)`."""
    return wrap(attention)(x, x, positions, None, model_mode="train", deterministic=True)
'''

TESTS = """\
import sys
from pathlib import Path

import numpy as np
import pytest

import maxtext_compat
import mylayer


def test_my_package_and_maxtext_compat_are_the_installed_ones():
    assert Path(mylayer.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]  # editable, here
    assert Path(maxtext_compat.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())  # the wheel's copy


@pytest.mark.maxtext_release(">=0.1.0")
def test_old_attention_call_gives_one_array_equal_to_maxtexts_own_output(tiny_maxtext_model, maxtext_row):
    m = tiny_maxtext_model
    attention = m.attention(batch=2, seq=8)
    x = np.random.default_rng(0).standard_normal((2, 8, m.config.emb_dim)).astype("float32")
    positions = np.broadcast_to(np.arange(8), (2, 8))
    with m.context():
        out = mylayer.attend(attention, x, positions)
        native = attention(x, x, positions, None, model_mode="train", deterministic=True)
    assert not isinstance(out, tuple) and out.shape == (2, 8, m.config.emb_dim)
    if maxtext_row.convention != "legacy":  # #2616 returns (out, kv_cache) natively
        assert isinstance(native, tuple) and len(native) == 2
        native = native[0]
    np.testing.assert_array_equal(np.asarray(out), np.asarray(native))

"""


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH (make test puts it there; so does `make envs`)")
    return str(Path(uv).resolve())  # PATH may name it relative to the checkout; the runs below are elsewhere


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900, both: bool = False) -> str:
    """The command's stdout (with `both`, stdout and stderr); a failure shows both."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    everything = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{shlex.join(cmd)} exited with {proc.returncode}:\n{everything[-6000:]}"
    return everything if both else proc.stdout


@pytest.fixture(scope="module")
def downstream(tmp_path_factory):
    """(project folder, its venv's bin, the wheel, environment variables): the wheel built from this checkout and
    installed, with nox, into the project's own venv; the environments' folder shared by every run below."""
    root = tmp_path_factory.mktemp("downstream")
    assert not root.resolve().is_relative_to(REPO)
    uv = _uv()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAXTEXT_COMPAT_ENV", "VIRTUAL_ENV"))}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    _run([uv, "build", "--quiet", "--wheel", "--out-dir", str(root / "dist"), str(REPO)], root, env)
    (wheel,) = (root / "dist").glob("maxtext_compat-*.whl")
    project = root / "proj"
    (project / "mylayer").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "mylayer"\nversion = "0.0.1"\ndependencies = ["maxtext-compat", "numpy"]\n\n'
        '[project.optional-dependencies]\ntest = ["pytest"]\n',
        encoding="utf-8",
    )
    (project / "mylayer" / "__init__.py").write_text(PACKAGE, encoding="utf-8")
    (project / "tests" / "test_layer.py").write_text(TESTS, encoding="utf-8")
    recipe, _, _ = _readme_recipe()
    assert recipe.startswith("# tests/test_mine.py\n")
    (project / "tests" / "test_mine.py").write_text(recipe, encoding="utf-8")
    (project / "noxfile.py").write_text(
        'from maxtext_compat.runner.nox import compat_sessions\n\ncompat_sessions(["0.1.0", "0.2.5"], extras="test")\n',
        encoding="utf-8",
    )
    venv = root / "venv"
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], root, env)
    _run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel), "nox"], root, env)
    from maxtext_compat.runner.envs import find_python

    # the project's venv, uv, and a Python 3.12 (the sets' interpreter) on PATH, as on a user's runner
    python312 = Path(find_python("3.12")).parent
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(uv).parent), str(python312), env.get("PATH", "")])
    env["MAXTEXT_COMPAT_ENVS_DIR"] = str(root / "envs")  # one build per set, reused by every run (same key)
    return project, venv / "bin", wheel, env


@pytest.fixture(scope="module")
def single_run(downstream):
    """README recipe 3's command, as written, in the project: its report, from the project's own folder."""
    project, _, _, env = downstream
    _, command, _ = _readme_recipe()
    assert command == f"maxtext-compat matrix {' '.join(RELEASES)} --extras test"
    out = _run(shlex.split(command), project, env)
    return json.loads((project / ".maxtext-compat" / "compat-report.json").read_text(encoding="utf-8")), out


@pytest.mark.extended  # a project's tests run through `matrix --maxtext` in make test: test_own_maxtext_project
def test_the_matrix_runs_the_projects_tests_on_both_releases(downstream, single_run):
    """README recipe 3 (its closing line counts its one test file; the project has two more tests per release)."""
    project, _, _, _ = downstream
    report, out = single_run
    _, _, shown = _readme_recipe()
    assert shown == f"compat-matrix: {len(RELEASES)} passed, 0 failed, 0 skipped"
    n = len(RELEASES) * TESTS_PER_ENV
    assert f"compat-matrix: {n} passed, 0 failed, 0 skipped" in out, out[-3000:]
    for name in SETS:  # the recipe's own test passed on each release
        junit = (project / ".maxtext-compat" / "junit" / f"{name}.xml").read_text(encoding="utf-8")
        case = re.search(
            r'<testcase classname="tests.test_mine" name="test_old_call_on_this_release"[^>]*?(/>|>.*?</testcase>)',
            junit,
            re.S,
        )
        assert case and "<failure" not in case.group(0) and "<skipped" not in case.group(0), junit[-2000:]
    rows = {e["name"]: e for e in report["envs"]}
    assert list(rows) == list(SETS)
    for name, release in zip(SETS, RELEASES, strict=True):
        row = rows[name]
        assert (row["status"], row["passed"], row["failed"], row["skipped"]) == ("ok", TESTS_PER_ENV, 0, 0), row
        assert row["versions"]["maxtext"] == release
    assert report["run"]["project"] == "mylayer" and report["run"]["claims"] is False
    assert report["mocked_rows"] == [] and report["mocked_tpu_inference_rows"] == []  # no claim about our rows
    state = project / ".maxtext-compat"
    for name in SETS:
        assert (state / "junit" / f"{name}.xml").is_file()
    for page in ("compat-report.md", "compat-report.html"):
        assert (state / page).is_file()
    assert "Rows covered only by mocked versions" not in (state / "compat-report.md").read_text(encoding="utf-8")


def _workflow_commands() -> dict[str, list[str]]:
    """The `run:` steps of each job of the shipped workflow, after checking its shape."""
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads the bare key `on` as true
    assert set(triggers) == {"push", "pull_request"}
    jobs = doc["jobs"]
    assert list(jobs) == ["plan", "test", "report"]
    for name, job in jobs.items():
        assert job["runs-on"] == "ubuntu-latest", name
        for need in [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", []):
            assert need in jobs and list(jobs).index(need) < list(jobs).index(name), (name, need)
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), step
            if "uses" in step:
                action, _, version = step["uses"].partition("@")
                assert action.count("/") == 1 and version.startswith("v"), step
    assert jobs["plan"]["outputs"]["jobs"] == "${{ steps.jobs.outputs.jobs }}"
    assert jobs["test"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.plan.outputs.jobs) }}"
    assert doc["env"]["RELEASES"] == " ".join(RELEASES) and doc["env"]["EXTRAS"] == "test"
    return {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in jobs.items()}


def _bash(command: str, cwd: Path, env: dict[str, str]) -> str:
    return _run(["bash", "-eo", "pipefail", "-c", command], cwd, env)


@pytest.mark.extended  # two more runs of the project (~2 min); test_report_merge holds the merge to the single report
def test_the_shipped_workflows_shards_merge_into_the_single_machine_report(downstream, single_run, tmp_path):
    """The workflow's own commands, run here as its jobs would: the plan's job list, each job one shard in its own
    folder and process, then the report job merging the uploaded folders: the same cells and counts."""
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.report.grid import build_grid

    project, _, _, env = downstream
    steps = _workflow_commands()
    env = {**env, "RELEASES": " ".join(RELEASES), "EXTRAS": "test", "GITHUB_OUTPUT": str(tmp_path / "output")}
    for command in steps["plan"][1:]:  # after `pip install uv maxtext-compat`, which the fixture did from the wheel
        _bash(command, project, env)
    key, _, value = (tmp_path / "output").read_text(encoding="utf-8").strip().partition("=")
    jobs = json.loads(value)
    assert key == "jobs" and sorted(j["name"] for j in jobs) == sorted(SETS) and len(jobs) == 2
    assert {j["shard"] for j in jobs} == {"1/2", "2/2"}
    (install, test_command) = steps["test"]
    assert install == steps["plan"][0] == "python -m pip install uv maxtext-compat"
    uploads = tmp_path / "all"
    for job in jobs:
        machine = tmp_path / f"job-{job['shard'].replace('/', '-')}"
        shutil.copytree(project, machine, ignore=shutil.ignore_patterns(".maxtext-compat"))
        _bash(test_command.replace("${{ matrix.shard }}", job["shard"]), machine, env)
        upload = uploads / f"results-{job['name']}"  # upload-artifact's paths, under the artifact's name
        upload.mkdir(parents=True)
        shutil.copy(machine / "results" / "compat-report.json", upload)
        shutil.copytree(machine / "results" / "junit", upload / "junit")
    (report_command,) = steps["report"][1:]
    _bash(report_command, tmp_path, env)
    merged = json.loads((tmp_path / "report" / "compat-report.json").read_text(encoding="utf-8"))
    single, _ = single_run
    fields = ("name", "maxtext", "versions", "passed", "failed", "errors", "skipped", "status")
    assert [{k: e[k] for k in fields} for e in merged["envs"]] == [{k: e[k] for k in fields} for e in single["envs"]]
    assert merged["run"]["missing"] == [] and merged["run"]["merged_from"] == 2
    m = load_matrix()
    m = type(m)(**{**m.__dict__, "environments": dict(m.pin_sets)})

    def cells(data):
        grid = build_grid(data, m)
        return {k: (c.state, [e.name for e in c.envs]) for k, c in grid.cells.items()}

    assert cells(merged) == cells(single)
    for name in SETS:
        assert (tmp_path / "report" / "junit" / f"{name}.xml").is_file()


@pytest.mark.extended  # it reads the matrix run above (make test-extended's)
def test_pins_then_plain_uv_installs_what_the_matrix_built(downstream, single_run, tmp_path):
    """`maxtext-compat pins 0.1.0 --format commands`, run as a user would, then the wheel and the project: the same
    packages at the same versions as the matrix's environment of that set."""
    project, _, wheel, env = downstream
    name = SETS[0]
    script = _run(["maxtext-compat", "pins", RELEASES[0], "--format", "commands", "--folder", "pins"], tmp_path, env)
    _bash(script, tmp_path, env)  # creates .venv with the set
    uv, python = shutil.which("uv", path=env["PATH"]), str(tmp_path / ".venv" / "bin" / "python")
    held = ["--exclude-newer", json.loads(_run(["maxtext-compat", "pins", name, "--format", "json"], tmp_path, env))
            ["exclude_newer"]]  # fmt: skip
    _run([uv, "pip", "install", "--python", python, *held, f"{wheel}[test]"], tmp_path, env)
    _run([uv, "pip", "install", "--python", python, *held, "-e", f"{project}[test]"], tmp_path, env)

    def packages(py: str) -> dict[str, str]:
        listing = json.loads(_run([uv, "pip", "list", "--python", py, "--format", "json"], tmp_path, env))
        return {p["name"].lower(): p["version"] for p in listing}

    built = packages(str(Path(env["MAXTEXT_COMPAT_ENVS_DIR"]) / name / "bin" / "python"))
    assert packages(python) == built
    assert built["maxtext"] == RELEASES[0] and "mylayer" in built and "maxtext-compat" in built


@pytest.mark.extended  # the matrix test above runs the same sets through the same runner; nox adds its session layer
def test_the_nox_helper_runs_the_same_tests_on_the_same_sets(downstream):
    project, bin_dir, _, env = downstream
    out = _run([str(bin_dir / "nox"), "--non-interactive", "-s", "compat"], project, env, timeout=1200, both=True)
    for name in SETS:
        assert f"Session compat({name}) was successful" in out, out[-4000:]
    assert out.count(f"{TESTS_PER_ENV} passed") == len(SETS), out[-4000:]
