"""`maxtext-compat matrix 0.2.5 --maxtext SOURCE` as another team runs it: a project of its own, outside this
checkout, with our wheel pip-installed, run over MaxText 0.2.5 unpacked into a source tree and over a fork of it that
renames kv_cache (the fork that adds a keyword-only argument resolves as the tree does: test_own_maxtext.py).

Each run builds the 0.2.5 pin set with MaxText replaced by the tree (installed editable, from uv's cache) and runs
the project's tests there; the report's column says where MaxText came from and the row its code resolved as, or,
for the renamed kv_cache, what the probes found and which layer refused it. The project's tests import MaxText's
Attention and ask our layers about it; they build no model, to keep the runs short.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.maxtext_trees import edit_attention_call, source_tree_from_wheel, wheel_from_record

# beside the training tests in 0.2.5's full set (its pins are 0.2.5's): off maxtext-0.2.5's long run
pytestmark = [pytest.mark.envs("maxtext-0.2.5-full"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TESTS = """\
import inspect
import json
import os
from importlib import metadata

import pytest

import maxtext_compat
from maxtext_compat import shims
from maxtext_compat.errors import ShimRefusedError
from maxtext_compat.shims import maxtext_profiles

KIND = os.environ["OWN_MAXTEXT_KIND"]


def test_maxtext_is_the_tree_installed_editable():
    url = json.loads(metadata.distribution("maxtext").read_text("direct_url.json"))
    assert url["dir_info"] == {"editable": True} and url["url"] == "file://" + os.environ["OWN_MAXTEXT_TREE"]


def test_the_row_is_found_by_probing_the_code():
    res = maxtext_compat.resolve()
    assert res.maxtext.name == "0.2.5" and res.code is not None
    assert res.code.rows == (() if KIND == "rename" else ("0.2.5",))


def test_attention_takes_what_the_tree_says():
    from maxtext.layers.attentions import Attention

    params = inspect.signature(Attention.__call__).parameters
    assert ("my_flag" in params) == (KIND == "keyword")
    assert ("kv_cache" in params) == (KIND != "rename")


def test_shims_install_accepts_or_refuses_by_name():
    if KIND != "rename":
        assert maxtext_profiles.choose(maxtext_compat.resolve()) == "known-defects"
        return
    with pytest.raises(ShimRefusedError) as err:
        shims.install()
    assert err.value.argument == "Attention.__call__ parameter kv_cache" and not shims.active_patches()
"""


def _uv() -> str:
    uv = shutil.which("uv") or shutil.which("uv", path=str(REPO / ".tools" / "bin"))
    if uv is None:
        pytest.fail("uv is not on PATH (make test puts it there)")
    return str(Path(uv).resolve())


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 1200) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd} exited with {proc.returncode}:\n{out[-6000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(project, environment variables, {kind: tree}): our wheel in the project's venv, two MaxText trees."""
    root = tmp_path_factory.mktemp("own-maxtext")
    assert not root.resolve().is_relative_to(REPO)
    uv = _uv()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAXTEXT_COMPAT_ENV", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    _run([uv, "build", "--quiet", "--wheel", "--out-dir", str(root / "dist"), str(REPO)], root, env)
    (ours,) = (root / "dist").glob("maxtext_compat-*.whl")
    tree = source_tree_from_wheel(wheel_from_record(root / "maxtext-wheel"), root / "maxtext")
    trees = {"tree": tree}
    for kind in ("rename",):
        trees[kind] = edit_attention_call(shutil.copytree(tree, root / f"maxtext-{kind}"), kind)
    proj = root / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "mylayer").mkdir()
    (proj / "mylayer" / "__init__.py").write_text('"""A layer on MaxText."""\n', encoding="utf-8")
    (proj / "tests" / "test_own.py").write_text(TESTS, encoding="utf-8")
    (proj / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "mylayer"\nversion = "0.0.1"\ndependencies = ["maxtext-compat"]\n\n'
        '[project.optional-dependencies]\ntest = ["pytest"]\n',
        encoding="utf-8",
    )
    venv = root / "venv"
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], root, env)
    _run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(ours)], root, env)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(uv).parent), str(Path(sys.executable).parent),
                                   env.get("PATH", "")])  # fmt: skip
    env["MAXTEXT_COMPAT_ENVS_DIR"] = str(root / "envs")
    return proj, env, trees


# the tree and the fork refused by name; the fork with an added argument is accepted like the tree
# (test_own_maxtext.py shows it through doctor and shims.install()), so its run here would repeat the tree's
@pytest.mark.parametrize("kind", ["tree", "rename"])
def test_the_projects_tests_run_on_its_own_maxtext(project, kind):
    proj, env, trees = project
    tree = trees[kind]
    run_env = {**env, "OWN_MAXTEXT_KIND": kind, "OWN_MAXTEXT_TREE": str(tree)}
    out = _run(["maxtext-compat", "matrix", "0.2.5", "--maxtext", str(tree), "--extras", "test"], proj, run_env)
    assert "compat-matrix: 4 passed, 0 failed, 0 skipped" in out, out[-4000:]
    report = json.loads((proj / ".maxtext-compat" / "compat-report.json").read_text(encoding="utf-8"))
    (row,) = report["envs"]
    assert row["name"].startswith("maxtext-0.2.5-own-") and row["status"] == "ok" and row["passed"] == 4
    assert row["versions"]["maxtext"] == "0.2.5 (editable)"
    if kind == "rename":
        assert row["source"].startswith(f"MaxText from {tree} at 0.2.5: probes match no row (against 0.2.5 they "
                                        "found convention legacy; params.attention [")  # fmt: skip
        assert "shims.install() refused it: ShimRefusedError: [Attention.__call__ parameter kv_cache]" in row["source"]
    else:
        assert row["source"] == f"MaxText from {tree} at 0.2.5, resolved as 0.2.5 by probes"
    assert f"{row['name']}: {row['source']}" in out  # the console's table says it too
    md = (proj / ".maxtext-compat" / "compat-report.md").read_text(encoding="utf-8")
    assert f"## Your own MaxText\n\n- {row['name']}: {row['source']}" in md
