"""The user's own MaxText: the installed release's wheel (0.2.4 and 0.2.5) unpacked into a source tree and installed
editable, two forks of it, and the same tree installed from git. `doctor` resolves each by probing its code and names
where it came from (PEP 610); `shims.install()` accepts the fork that adds a keyword-only argument and refuses, by
name, the one that renames kv_cache, with nothing patched.

Each install is a venv of its own holding only that MaxText (`uv pip install --no-deps`, the build backend from
uv's cache); the rest of the stack is this environment's, reached through a .pth file.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.maxtext_trees import edit_attention_call, git_commit, source_tree_from_wheel, wheel_from_record

# make test: the 0.2.5 tree and its forks (maxtext-0.2.5-full); 0.2.4's tree is make test-extended's
pytestmark = [pytest.mark.envs("maxtext-0.2.4", "maxtext-0.2.5-full"), pytest.mark.extended_in("maxtext-0.2.4")]

REPO = Path(__file__).resolve().parents[2]
SRC = str(REPO / "src")
INSTALL = """
import json
from maxtext_compat import shims
try:
    shims.install()
    out = {"installed": [p.target for p in shims.active_patches()]}
except Exception as exc:
    out = {"error": type(exc).__name__, "argument": exc.argument, "message": str(exc),
           "patches": len(shims.active_patches())}
print(json.dumps(out))
"""


def _uv() -> str:
    uv = shutil.which("uv") or shutil.which("uv", path=str(REPO / ".tools" / "bin"))
    if uv is None:
        pytest.fail("uv is not on PATH (make test puts it there)")
    return uv


def _venv(where: Path, requirement: list[str]) -> Path:
    """A venv holding only `requirement` (no dependencies), the stack reached through this environment's."""
    uv = _uv()
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), "--no-deps", *requirement], check=True)
    (Path(site.getsitepackages([str(where)])[0]) / "zz_stack.pth").write_text(site.getsitepackages()[0] + "\n")
    return python


def _run(python: Path, *args: str) -> str:
    env = {"PYTHONPATH": SRC, "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run([str(python), *args], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """{name: (tree, python)}: the unpacked release, its two forks (editable), and the tree from git."""
    root = tmp_path_factory.mktemp("own")
    tree = source_tree_from_wheel(wheel_from_record(root / "wheel"), root / "maxtext")
    out = {}
    for name, kind in (("keyword", "keyword"), ("rename", "rename")):
        fork = edit_attention_call(shutil.copytree(tree, root / f"fork-{name}"), kind)
        out[name] = (fork, _venv(root / f"venv-{name}", ["-e", str(fork)]))
    out["tree"] = (tree, _venv(root / "venv-tree", ["-e", str(tree)]))
    commit = git_commit(shutil.copytree(tree, root / "git-tree"))
    out["git"] = (commit, _venv(root / "venv-git", [f"maxtext @ git+file://{root / 'git-tree'}@{commit}"]))
    return out


def _doctor(python: Path) -> dict:
    return json.loads(_run(python, "-m", "maxtext_compat.cli", "doctor", "--json"))


@pytest.fixture(scope="module")
def release() -> str:
    from maxtext_compat.testing import tiny

    return tiny.installed_row().name


def test_the_unpacked_tree_resolves_as_its_row_by_probes(trees, release):
    tree, python = trees["tree"]
    report = _doctor(python)
    res = report["resolution"]
    assert res["maxtext"] == release and res["versions"]["maxtext"] == f"{release} (editable)"
    # rows: every row whose code facts the tree's match (0.2.2 to 0.2.5 share theirs); the release's own wins
    assert release in res["code"]["rows"] and res["code"]["row"] == release
    assert {k: v for k, v in res["code"].items() if k != "rows"} == {"source": f"editable {tree}", "row": release,
                                                                      "differences": {}, "refusal": None}  # fmt: skip
    text = _run(python, "-m", "maxtext_compat.cli", "doctor")
    assert f"MaxText source: editable {tree}; probes: its code matches row(s) " in text


def test_a_git_install_shows_its_url_and_commit(trees, release):
    commit, python = trees["git"]
    code = _doctor(python)["resolution"]["code"]
    assert code["source"].startswith("git+file://") and code["source"].endswith(f"at {commit}")
    assert code["row"] == release and code["refusal"] is None


@pytest.mark.slow  # shims.install() imports MaxText: ~1 min
def test_a_fork_with_an_added_keyword_only_argument_is_accepted(trees, release):
    _, python = trees["keyword"]
    code = _doctor(python)["resolution"]["code"]
    assert code["row"] == release and code["differences"] == {} and code["refusal"] is None
    installed = json.loads(_run(python, "-c", INSTALL).strip().splitlines()[-1])
    assert installed["installed"] and all(t.startswith("maxtext.") for t in installed["installed"])


def test_a_fork_that_renames_kv_cache_is_refused_by_name_with_nothing_patched(trees):
    fork, python = trees["rename"]
    code = _doctor(python)["resolution"]["code"]
    assert code["rows"] == [] and code["row"] is None
    assert code["differences"]["params.attention"]["row"] == sorted(
        [*code["differences"]["params.attention"]["installed"], "kv_cache"]
    )
    assert code["refusal"] == {"what": "Attention.__call__ parameter kv_cache", "row": "present", "installed": "absent"}
    refused = json.loads(_run(python, "-c", INSTALL).strip().splitlines()[-1])
    assert refused["error"] == "ShimRefusedError" and refused["patches"] == 0
    assert refused["argument"] == "Attention.__call__ parameter kv_cache"
    assert f"MaxText from editable {fork}" in refused["message"]
