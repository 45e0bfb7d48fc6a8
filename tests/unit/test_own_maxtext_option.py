"""`matrix RELEASE --maxtext SOURCE` without building anything: the derived environment, its install plan, bad input.

tests/compat/test_own_maxtext_project.py builds and runs a real project on real trees; here the CLI runs in-process
on the shipped matrix and the plan is read, not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maxtext_compat import cli
from maxtext_compat.runner import pinsets, workspace

pytestmark = pytest.mark.envs("unit")


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pyproject.toml").write_text('[project]\nname = "mylayer"\nversion = "0"\n')
    (tmp_path / "maxtext").mkdir()
    (tmp_path / "maxtext" / "pyproject.toml").write_text('[project]\nname = "maxtext"\nversion = "0.2.6.dev0"\n')
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.delenv(workspace.ENVS_DIR_VAR, raising=False)
    return tmp_path


def test_the_set_without_its_maxtext_pin_then_the_folder_editable_under_its_constraints(project, tmp_path):
    ws = workspace.current()
    own_ws, (own,) = workspace.with_own_maxtext(ws, ["maxtext-0.2.5"], str(project / "maxtext"))
    spec, base = own_ws.matrix.environment(own), ws.matrix.environment("maxtext-0.2.5")
    assert own.startswith("maxtext-0.2.5-own-") and own not in ws.matrix.environments
    assert [r for r in base.requirements if not r.startswith("maxtext==")] == list(spec.requirements)
    plan = pinsets.install_plan(spec, tmp_path / "a", tmp_path / "b", ("maxtext-compat",), None, own_ws.maxtext_install)
    assert plan[1][:2] == ("-e", str((project / "maxtext").resolve())) and plan[1][2] == "-c"
    constraints = Path(plan[1][3]).read_text()
    assert "jax==0.11.2" in constraints and "maxtext" not in constraints
    assert plan[2][0] == "maxtext-compat"  # then maxtext-compat, held by the set's date and overrides
    # the same source gives the same environment; another source, another one
    assert workspace.with_own_maxtext(ws, ["maxtext-0.2.5"], str(project / "maxtext"))[1] == [own]
    git = workspace.with_own_maxtext(ws, ["maxtext-0.2.5"], "git+file:///x/maxtext@main")
    assert git[1] != [own] and git[0].maxtext_install == ("maxtext @ git+file:///x/maxtext@main",)


def test_a_set_that_installs_maxtext_without_dependencies_installs_the_source_so(project):
    ws, (own,) = workspace.with_own_maxtext(workspace.current(), ["maxtext-0.1.0"], str(project / "maxtext"))
    assert ws.maxtext_install[-1] == "--no-deps"
    assert not any("maxtext==" in r for r in ws.matrix.environment(own).no_deps)


def test_list_names_the_derived_environment(project, capsys):
    assert cli.main(["matrix", "0.2.5", "--maxtext", str(project / "maxtext"), "--list"]) == 0
    assert capsys.readouterr().out.startswith("maxtext-0.2.5-own-")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["matrix", "0.1.0", "0.2.5", "--maxtext", "."], "[names] --maxtext replaces the MaxText of one pin set"),
        (["matrix", "0.2.5", "--maxtext", "nowhere"], "[--maxtext] is no MaxText to install"),
        (["matrix", "0.2.5", "--maxtext", "pyproject.toml"], "Expected: a folder holding MaxText's source"),
    ],
)
def test_bad_input_is_refused_with_a_typed_error(project, capsys, argv, words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "InvalidArgumentError" in err and words in err, err
