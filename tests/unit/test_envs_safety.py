"""`envs build` deletes nothing outside its own folder and never leaves a half-good environment.

Found by probing (issue 11 section 3): an environment named `..` deleted the folder above the
envs folder, `.` every environment; two builds of one environment at once left a broken one
marked built; Ctrl-C during `--force` left a half-deleted environment the next run called up to
date. Most tests here swap uv for a fake that makes a minimal venv (fast); the concurrency, kill
and interrupt tests build a real tiny environment (`six`) with uv from its warm cache.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
import yaml
from env_specs import tiny_spec

from helpers.shipped import REPO, combined_doc
from maxtext_compat.errors import EnvironmentBuildError, InvalidArgumentError, MatrixError
from maxtext_compat.matrix import EnvironmentSpec, parse_matrix
from maxtext_compat.runner import envs

SRC = REPO / "src"
HAS_UV = shutil.which("uv") is not None
needs_uv = pytest.mark.skipif(not HAS_UV, reason="uv is installed by `make envs`")
pytestmark = pytest.mark.envs("unit")  # builds environments: once per matrix run is enough
BAD_NAMES = ["..", ".", "", " ", "/abs", "a/b", "a\\b", ".hidden", "a b", "é", "a\n", "x" * 65, "-rf", "a\0b"]


_spec = tiny_spec


@pytest.fixture
def envs_dir(tmp_path, monkeypatch):
    """An envs folder of the test's own, inside a parent folder holding a sentinel file."""
    d = tmp_path / "checkout" / "envs"
    d.mkdir(parents=True)
    (tmp_path / "checkout" / "sentinel").write_text("keep me")
    monkeypatch.setenv(envs.ENVS_DIR_VAR, str(d))
    return d


def _fake_populate(spec, path, uv, python, t0, ws):
    """A minimal venv (pyvenv.cfg, bin/python) and the marker, without uv."""
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    (path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    envs.write_marker(path, spec, python, t0, ws)


@pytest.fixture
def fake_uv(monkeypatch):
    monkeypatch.setattr(envs, "_populate", _fake_populate)
    monkeypatch.setattr(envs, "find_uv", lambda: ["uv"])
    monkeypatch.setattr(envs, "find_python", lambda version: sys.executable)


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if ".build-" in p.name)


# ---------------------------------------------------------------------------------------------
# Names: refused in the matrix, at the CLI and in the library
# ---------------------------------------------------------------------------------------------


# An entry to copy under a new name: the CI's unit environment, or a pin set (a user's project builds each pin set
# as an environment of that name, so its names obey the same rule).
_MODEL = {"environments": "unit", "pin_sets": "maxtext-0.1.0"}


def _doc_with_env(name: str, section: str = "environments") -> str:
    doc = combined_doc()
    doc[section][name] = copy.deepcopy(doc[section][_MODEL[section]])
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize("section", sorted(_MODEL))
@pytest.mark.parametrize("name", [n for n in BAD_NAMES if n != "a\0b"], ids=repr)
def test_the_matrix_refuses_an_environment_name_that_is_not_one_plain_directory(name, section):
    with pytest.raises(MatrixError) as e:
        parse_matrix(_doc_with_env(name, section), "user.yaml")
    assert "not a valid environment name" in str(e.value) and repr(name) in str(e.value)
    assert e.value.key.startswith(f"{section}.")


@pytest.mark.parametrize("section", sorted(_MODEL))
def test_the_matrix_refuses_two_names_that_differ_only_in_case(section):
    doc = yaml.safe_load(_doc_with_env(_MODEL[section].upper(), section))
    with pytest.raises(MatrixError, match="only in letter case") as e:
        parse_matrix(yaml.safe_dump(doc, sort_keys=False), "user.yaml")
    assert e.value.key == f"{section}.{_MODEL[section].upper()}"


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_the_library_refuses_a_bad_name_before_touching_the_disk(name, envs_dir, fake_uv):
    with pytest.raises(InvalidArgumentError) as e:
        envs.build(_spec(name), log=lambda _: None)
    assert e.value.argument == "environment name" and repr(name) in str(e.value)
    with pytest.raises(InvalidArgumentError):
        envs.env_path(name)
    assert (envs_dir.parent / "sentinel").read_text() == "keep me"
    assert list(envs_dir.iterdir()) == []


@pytest.mark.parametrize("action", ["build", "python"])
@pytest.mark.parametrize("name", ["..", ".", "/abs", "a/b", ""], ids=repr)
def test_the_cli_refuses_a_bad_name_with_exit_2(name, action, envs_dir):
    from maxtext_compat.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["envs", action, name])
    assert code == 2, err.getvalue()
    assert "InvalidArgumentError: [environment name]" in err.getvalue()


def test_a_matrix_naming_dotdot_cannot_delete_the_folder_above_the_envs_folder(envs_dir, tmp_path, fake_uv):
    """The reported case end to end: a user matrix lists `..`, then `envs build ..`."""
    from maxtext_compat.cli import main

    matrix = tmp_path / "user-matrix.yaml"
    matrix.write_text(_doc_with_env(".."))
    err = io.StringIO()
    with (
        mock.patch.dict(os.environ, {"MAXTEXT_COMPAT_MATRIX": str(matrix)}),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        code = main(["envs", "build", ".."])
    assert code == 2, err.getvalue()
    assert (envs_dir.parent / "sentinel").read_text() == "keep me"
    assert envs_dir.is_dir()


# ---------------------------------------------------------------------------------------------
# Deletion: strictly inside the envs folder, and only of environments
# ---------------------------------------------------------------------------------------------


def test_an_environment_that_is_a_symlink_out_of_the_envs_folder_is_refused(envs_dir, tmp_path, fake_uv):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (outside / "data").write_text("keep me")
    (envs_dir / "tiny").symlink_to(outside)
    with pytest.raises(EnvironmentBuildError, match="symbolic link") as e:
        envs.build(_spec(), force=True, log=lambda _: None)
    assert "Fix:" in str(e.value)
    assert (outside / "data").read_text() == "keep me"
    assert (envs_dir / "tiny").is_symlink()


def test_a_folder_that_is_not_an_environment_is_never_replaced(envs_dir, fake_uv):
    """E.g. MAXTEXT_COMPAT_ENVS_DIR pointing at a checkout and an environment named `src`."""
    (envs_dir / "src").mkdir()
    (envs_dir / "src" / "code.py").write_text("keep me")
    with pytest.raises(EnvironmentBuildError, match="is not an environment") as e:
        envs.build(_spec("src"), log=lambda _: None)
    assert "Fix:" in str(e.value)
    assert (envs_dir / "src" / "code.py").read_text() == "keep me"


def test_remove_inside_refuses_every_path_not_directly_inside_the_root(tmp_path):
    root = tmp_path / "envs"
    (root / "a" / "b").mkdir(parents=True)
    for path in (tmp_path, root, root / "a" / "b", root / ".." / "envs", tmp_path / "elsewhere"):
        path.mkdir(exist_ok=True)
        with pytest.raises(EnvironmentBuildError, match="not strictly inside"):
            envs._remove_inside(path, root)
    assert (root / "a" / "b").is_dir()
    envs._remove_inside(root / "a", root)
    assert not (root / "a").exists()


def test_an_envs_dir_of_whitespace_is_refused(monkeypatch):
    monkeypatch.setenv(envs.ENVS_DIR_VAR, "  ")
    with pytest.raises(InvalidArgumentError, match=envs.ENVS_DIR_VAR):
        envs.envs_dir()


# ---------------------------------------------------------------------------------------------
# Never half-good: interrupts and failures keep the old environment or leave none
# ---------------------------------------------------------------------------------------------


def test_a_build_goes_beside_and_is_swapped_in(envs_dir, fake_uv):
    logs: list[str] = []
    st = envs.build(_spec(), log=logs.append)
    assert st.built and st.up_to_date and _leftovers(envs_dir) == []
    (envs_dir / "tiny" / "old-file").write_text("from the first build")
    st = envs.build(_spec(), force=True, log=logs.append)
    assert st.up_to_date and not (envs_dir / "tiny" / "old-file").exists()  # a new folder, not a patched one
    assert _leftovers(envs_dir) == [] and "building (forced)" in logs[-2]


def test_interrupt_during_a_forced_rebuild_keeps_the_old_environment_whole(envs_dir, fake_uv, monkeypatch):
    envs.build(_spec(), log=lambda _: None)
    before = (envs_dir / "tiny" / envs.MARKER).read_text()

    def interrupted(spec, path, uv, python, t0, ws):
        (path / "bin").mkdir(parents=True)  # half way through
        raise KeyboardInterrupt

    monkeypatch.setattr(envs, "_populate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        envs.build(_spec(), force=True, log=lambda _: None)
    assert (envs_dir / "tiny" / envs.MARKER).read_text() == before
    assert envs.status(_spec()).up_to_date
    assert _leftovers(envs_dir) == []


def test_a_failure_between_the_two_renames_leaves_no_environment_marked_built(envs_dir, fake_uv, monkeypatch):
    envs.build(_spec(), log=lambda _: None)
    calls: list[tuple[str, str]] = []

    def rename(src, dst):
        calls.append((str(src), str(dst)))
        if len(calls) == 2:
            raise OSError("injected: the process dies between the renames")
        os.rename(src, dst)

    monkeypatch.setattr(envs, "_rename", rename)
    with pytest.raises(OSError, match="injected"):
        envs.build(_spec(), force=True, log=lambda _: None)
    assert not envs.status(_spec()).built  # the old marker went first; nothing half-good is "built"
    monkeypatch.setattr(envs, "_rename", os.rename)
    assert envs.build(_spec(), log=lambda _: None).up_to_date
    assert _leftovers(envs_dir) == []


def test_leftovers_of_a_killed_build_are_removed_by_the_next_build_of_that_environment(envs_dir, fake_uv):
    (envs_dir / ".tiny.build-abcd1234" / "env").mkdir(parents=True)
    (envs_dir / ".tiny2.build-abcd1234").mkdir()  # another environment's: left alone
    (envs_dir / ".tiny.build-x.build-abcd1234").mkdir()  # environment "tiny.build-x": left alone
    envs.build(_spec(), log=lambda _: None)
    assert _leftovers(envs_dir) == [".tiny.build-x.build-abcd1234", ".tiny2.build-abcd1234"]


# ---------------------------------------------------------------------------------------------
# Real builds (uv, a tiny environment with six): two processes at once, Ctrl-C, kill -9
# ---------------------------------------------------------------------------------------------

CHILD = """
import json, sys
from maxtext_compat.runner import envs
from maxtext_compat.matrix import EnvironmentSpec
d = json.loads(sys.argv[1])
spec = EnvironmentSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
if sys.argv[2] == "hang-after-venv":  # stop inside the build, after `uv venv`, until killed
    real = envs._run
    def _run(cmd, spec):
        real(cmd, spec)
        if "venv" in cmd:
            print("[child] venv made", flush=True)
            sys.stdin.read()
    envs._run = _run
envs.build(spec, force=sys.argv[3] == "force", log=lambda m: print(m, flush=True))
print("[child] done", flush=True)
"""


def _child(spec: EnvironmentSpec, envs_dir: Path, mode: str = "", force: bool = False) -> subprocess.Popen:
    env = {**os.environ, envs.ENVS_DIR_VAR: str(envs_dir), "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(spec.as_dict()), mode or "-", "force" if force else "-"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _read_until(proc: subprocess.Popen, needle: str, timeout: float = 120.0) -> list[str]:
    """Lines of the child's output up to the one containing `needle` (fails after `timeout` s)."""
    lines: list[str] = []
    found = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if needle in line:
                found.set()
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if not found.wait(timeout):
        proc.kill()
        pytest.fail(f"the child never printed {needle!r}: {lines}")
    return lines


def _python_has_six(name: str) -> bool:
    py = envs.env_python(name)
    return subprocess.run([py, "-c", "import six, maxtext_compat"], check=False).returncode == 0


@needs_uv
def test_two_processes_building_one_environment_wait_for_each_other(envs_dir):
    spec = _spec()
    # Hold the environment's lock so both children start and wait; then let them race.
    with envs.env_lock("tiny", log=lambda _: None):
        a, b = _child(spec, envs_dir), _child(spec, envs_dir)
        _read_until(a, "waiting for another build")
        _read_until(b, "waiting for another build")
    out_a, _ = a.communicate(timeout=300)
    out_b, _ = b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, (out_a, out_b)
    both = out_a + out_b
    assert both.count("building (not built)") == 1, both  # one built it, the other found it done
    assert both.count("up to date") == 1, both
    assert envs.status(spec).up_to_date and _python_has_six("tiny")
    assert _leftovers(envs_dir) == []


@needs_uv
def test_kill_9_during_a_forced_rebuild_keeps_the_old_environment_and_the_next_build_cleans_up(envs_dir):
    spec = _spec()
    assert envs.build(spec, log=lambda _: None).up_to_date
    child = _child(spec, envs_dir, mode="hang-after-venv", force=True)
    _read_until(child, "[child] venv made")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert envs.status(spec).up_to_date and _python_has_six("tiny")  # the old one, whole
    assert len(_leftovers(envs_dir)) == 1
    logs: list[str] = []
    assert envs.build(spec, force=True, log=logs.append).up_to_date
    assert _leftovers(envs_dir) == [] and _python_has_six("tiny")


@needs_uv
def test_ctrl_c_during_a_real_forced_rebuild_keeps_the_old_environment(envs_dir, monkeypatch):
    spec = _spec()
    assert envs.build(spec, log=lambda _: None).up_to_date
    real = envs._run

    def run(cmd, s):
        if "pip" in cmd:
            raise KeyboardInterrupt
        real(cmd, s)

    monkeypatch.setattr(envs, "_run", run)
    with pytest.raises(KeyboardInterrupt):
        envs.build(spec, force=True, log=lambda _: None)
    assert envs.status(spec).up_to_date and _python_has_six("tiny")
    assert _leftovers(envs_dir) == []


@needs_uv
def test_a_real_environment_works_after_the_rename_into_place(envs_dir):
    """uv writes the build path into scripts unless the venv is relocatable: pytest must still run."""
    assert envs.build(_spec(), log=lambda _: None).up_to_date
    pytest_script = envs_dir / "tiny" / "bin" / "pytest"
    assert ".build-" not in pytest_script.read_text()
    out = subprocess.run([pytest_script, "--version"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "pytest" in out.stdout + out.stderr
    cfg = (envs_dir / "tiny" / "pyvenv.cfg").read_text()
    assert "relocatable = true" in cfg
