"""The matrix commands from a user's project: which workspace a command runs in, `pins`, the job list, bad input.

Nothing is built here (tests/unit/test_downstream_project.py builds and runs a real project from the wheel); these
run the CLI in-process on the shipped matrix and read what it prints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from maxtext_compat import cli
from maxtext_compat.errors import EnvironmentBuildError, InvalidArgumentError
from maxtext_compat.matrix import load_matrix
from maxtext_compat.runner import pinsets, workspace

pytestmark = pytest.mark.envs("unit")

REPO = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(REPO / "compat_matrix.yaml")


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mylayer"\nversion = "0"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(workspace.ENVS_DIR_VAR, raising=False)
    return tmp_path


def _main(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_checkout_runs_its_ci_layout_and_a_project_the_pin_sets(project):
    ours = workspace.current(REPO)
    assert (
        ours.is_checkout
        and "unit" in ours.matrix.environments
        and "tpu-inference-0.32.0-jax012" in ours.matrix.environments
    )
    assert ours.state == REPO / "build" and ours.self_install == ("-e", f"{REPO}[test]")
    theirs = workspace.current()
    assert not theirs.is_checkout and theirs.project == project.resolve()
    assert dict(theirs.matrix.environments) == dict(MATRIX.pin_sets)  # no CI environment reaches a user
    assert theirs.state == project.resolve() / ".maxtext-compat" and theirs.envs_dir == theirs.state / "envs"
    assert theirs.project_install == ("-e", str(project.resolve())) and theirs.project_name == "mylayer"
    with_extras = workspace.current(extras="test,docs")
    assert with_extras.project_install == ("-e", f"{project.resolve()}[test,docs]")
    assert with_extras.identity != theirs.identity  # extras change what an environment holds: another key


def test_a_folder_without_a_project_is_refused_naming_the_option(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EnvironmentBuildError) as err:
        workspace.current()
    assert err.value.argument == "--project" and "pyproject.toml" in str(err.value)
    code, _, stderr = _main(capsys, "matrix", "0.2.5", "--list")
    assert code == 2 and "--project" in stderr and "pyproject.toml" in stderr


def test_a_cache_dir_that_is_a_file_is_refused(project, capsys):
    (project / "results").write_text("not a folder", encoding="utf-8")
    code, _, stderr = _main(capsys, "matrix", "0.2.5", "--cache-dir", "results", "--list")
    assert code == 2 and "[--cache-dir]" in stderr and "a file" in stderr, stderr
    assert (project / "results").read_text(encoding="utf-8") == "not a folder"  # left as it was


def test_extras_are_refused_in_the_checkout():
    with pytest.raises(InvalidArgumentError, match="--extras"):
        workspace.current(REPO, extras="test")


def test_a_project_names_releases_and_lists_jobs_for_a_ci_matrix(project, capsys):
    code, out, _ = _main(capsys, "matrix", "0.1.0", "0.2.5", "maxtext-0.1.0-jax011", "--list", "--json")
    jobs = json.loads(out)
    assert code == 0 and out.count("\n") == 1  # one line: $GITHUB_OUTPUT takes it as is
    assert [j["name"] for j in jobs] == ["maxtext-0.1.0", "maxtext-0.2.5", "maxtext-0.1.0-jax011"]
    assert sorted(j["shard"] for j in jobs) == ["1/3", "2/3", "3/3"]
    for job in jobs:  # each job's shard runs exactly its environment
        code, out, _ = _main(capsys, "matrix", "0.1.0", "0.2.5", "maxtext-0.1.0-jax011", "--shard", job["shard"],
                             "--list", "--json")  # fmt: skip
        assert [j["name"] for j in json.loads(out)] == [job["name"]]
        spec = MATRIX.pin_set(job["name"])
        assert (job["maxtext"], job["python"]) == (spec.maxtext, spec.python)


@pytest.mark.parametrize(
    ("argv", "error", "words"),
    [
        (["matrix", "9.9", "--list"], "MatrixError", "no pin set named '9.9'"),
        (["matrix", "unit", "--list"], "MatrixError", "no pin set named 'unit'"),  # CI environments are not shipped
        (["matrix", "../x", "--list"], "InvalidArgumentError", "environment name"),
        (["matrix", "0.2.5", "--shard", "3/2", "--list"], "InvalidArgumentError", "[--shard]"),
        (["pins", "0.9"], "MatrixError", "maxtext-compat pins --list"),
    ],
)
def test_bad_input_is_refused_with_a_typed_error(project, capsys, argv, error, words):
    code, _, stderr = _main(capsys, *argv)
    assert code == 2 and error in stderr and words in stderr, stderr


@pytest.mark.parametrize("bad", ["2", "1/", "a/b", "1/2/3"])
def test_a_malformed_shard_is_refused_by_the_parser(project, capsys, bad):
    with pytest.raises(SystemExit) as stop:
        cli.main(["matrix", "0.2.5", "--shard", bad, "--list"])
    assert stop.value.code == 2 and "expected K/N" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(MATRIX.pin_sets))
def test_pins_json_is_the_pin_set(capsys, name):
    code, out, _ = _main(capsys, "pins", name, "--format", "json")
    data, spec = json.loads(out), MATRIX.pin_set(name)
    assert code == 0 and data["name"] == spec.name and data["python"] == spec.python
    assert (data["requirements"], data["no_deps"], data["overrides"]) == (
        list(spec.requirements), list(spec.no_deps), list(spec.overrides))  # fmt: skip
    assert data["exclude_newer"] == spec.exclude_newer and data["env"] == dict(spec.env)
    assert data["matrix"] == pinsets.fingerprint(MATRIX)
    for line in data["constraints"]:  # every exact pin, nothing else
        assert "==" in line


@pytest.mark.parametrize("name", list(MATRIX.pin_sets))
def test_pins_parts_carry_every_line_and_say_what_the_part_is_not(capsys, name):
    spec = MATRIX.pin_set(name)
    for fmt, lines in (("requirements", spec.requirements), ("no-deps", spec.no_deps), ("overrides", spec.overrides)):
        code, out, _ = _main(capsys, "pins", name, "--format", fmt)
        body = [line for line in out.splitlines() if not line.startswith("#")]
        assert code == 0 and body == list(lines), (fmt, body)
        notes = "\n".join(line for line in out.splitlines() if line.startswith("#"))
        if spec.exclude_newer:
            assert spec.exclude_newer in notes  # a part alone without the date would resolve another set
        if spec.no_deps:
            assert "--no-deps" in notes


def test_pins_commands_run_the_same_steps_the_matrix_runs(capsys, tmp_path):
    spec = MATRIX.pin_set("0.2.5")
    code, out, _ = _main(capsys, "pins", "0.2.5", "--folder", str(tmp_path / "p"))
    steps = pinsets.install_steps(spec, tmp_path / "p")
    assert code == 0 and [line for line in out.splitlines() if line.startswith("uv pip install")] == [
        f"uv pip install --python .venv/bin/python {' '.join(s.args)}" for s in steps]  # fmt: skip
    for key, value in spec.env.items():
        assert f'export {key}="${{{key}:-{value}}}"' in out  # a default: the caller's value wins


def test_pins_list_names_every_set(capsys):
    code, out, _ = _main(capsys, "pins", "--list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == list(MATRIX.pin_sets)


def test_the_workspace_env_of_a_pin_set_gives_way_to_the_callers(project, monkeypatch):
    ws = workspace.current()
    spec = MATRIX.pin_set("0.2.5")
    monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
    assert ws.spec_env(spec)["JAX_PLATFORMS"] == "tpu,cpu"  # a user's TPU runner keeps its platform
    monkeypatch.delenv("JAX_PLATFORMS")
    assert ws.spec_env(spec)["JAX_PLATFORMS"] == "cpu"
    ours = workspace.current(REPO)
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert ours.spec_env(ours.matrix.environment("maxtext-0.2.5"))["JAX_PLATFORMS"] == "cpu"  # our CI: as written
    assert os.environ["JAX_PLATFORMS"] == "tpu"
