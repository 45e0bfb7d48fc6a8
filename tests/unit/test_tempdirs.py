"""maxtext_compat.tempdirs: each temporary directory goes when its owner does, and only its maker removes it.

Every case runs in a fresh process with TMPDIR pointed at an empty folder and looks at the folder after that process
has exited: what the exit handlers, the garbage collector and the exec watcher really did. `maxtext-compat serve
--tiny` is run for real, with a stand-in for the vllm executable (the exec is the point; vLLM is not needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.envs("unit")


def _run(tmp: Path, code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *argv], env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


def _emptied(folder: Path, limit: float = 60.0) -> list[str]:
    """The folder's entries once it is empty, or when `limit` runs out (a guard against a hang, not a pace: the
    watcher removes the directory as soon as the server's last process has gone)."""
    deadline = time.monotonic() + limit
    while os.listdir(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(os.listdir(folder))


def test_a_directory_is_removed_at_exit_at_the_latest(tmp):
    proc = _run(
        tmp,
        """
        import os
        from maxtext_compat import tempdirs
        path = tempdirs.make("maxtext_compat_")
        open(os.path.join(path, "written"), "w").close()
        assert os.path.dirname(path) == os.environ["TMPDIR"]
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp) == []


def test_an_owned_directory_goes_with_its_owner_not_before(tmp):
    proc = _run(
        tmp,
        """
        import gc, os
        from maxtext_compat import tempdirs

        class Config:
            def __init__(self, path):
                self.path = path

        kept = tempdirs.for_result("maxtext_compat_", Config)
        dropped = tempdirs.for_result("maxtext_compat_", Config)
        gone = dropped.path
        del dropped
        gc.collect()
        assert not os.path.exists(gone) and os.path.isdir(kept.path)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp) == []


def test_a_build_that_fails_leaves_nothing(tmp):
    proc = _run(
        tmp,
        """
        import os
        from maxtext_compat import tempdirs

        def build(path):
            raise ValueError(path)

        try:
            tempdirs.for_result("maxtext_compat_", build)
        except ValueError as err:
            assert not os.path.exists(str(err))
        else:
            raise SystemExit("the build's error was swallowed")
        """,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_forked_child_does_not_remove_its_parents_directory(tmp):
    """vLLM's engine core and multiprocessing workers are forked: their exit and their collector leave it alone."""
    proc = _run(
        tmp,
        """
        import gc, os, sys
        from maxtext_compat import tempdirs

        class Owner:
            def __init__(self, path):
                self.path = path

        owner = tempdirs.for_result("maxtext_compat_", Owner)
        path = owner.path
        pid = os.fork()
        if pid == 0:  # the child drops the owner and exits through the exit handlers
            del owner
            gc.collect()
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.isdir(path), "the child removed its parent's directory"
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp) == []


def _fake_vllm(tmp_path: Path, body: str) -> Path:
    """A stand-in `vllm`: `serve` execs it as `vllm serve MODEL ...`; it checks the model directory is there and
    that its $TMPDIR is the server's own folder, and leaves a file in it, as a killed vLLM engine leaves its IPC
    sockets."""
    script = tmp_path / "vllm"
    script.write_text(
        f'#!/bin/sh\n[ -f "$2/config.json" ] || exit 3\n'
        f'case "$TMPDIR" in */maxtext_compat_serve_*) ;; *) exit 4 ;; esac\n'
        f'touch "$TMPDIR/socket"\n{body}\n'
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("body", ["exit 0", "kill -9 $$"], ids=["exits", "killed"])
def test_serve_tiny_model_directory_is_removed_after_the_server_ends(tmp_path, tmp, body):
    """`maxtext-compat serve --tiny` execs vLLM, so no exit handler of ours runs: the watcher removes the model
    directory and the server's own $TMPDIR once the server has ended, even killed."""
    vllm = _fake_vllm(tmp_path, body)
    env = {**os.environ, "TMPDIR": str(tmp), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "serve", "--tiny", "--vllm-bin", str(vllm)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == (0 if body == "exit 0" else -9), proc.stderr  # 3: no model dir; 4: not its own TMPDIR
    assert "maxtext_compat_tiny_model_" in proc.stderr  # the note names the directory it wrote
    assert _emptied(tmp) == []


def test_serve_tiny_dry_run_keeps_the_directory_its_command_names(tmp):
    env = {**os.environ, "TMPDIR": str(tmp), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "serve", "--tiny", "--dry-run", "--vllm-bin", "vllm"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    (kept,) = os.listdir(tmp)
    assert str(tmp / kept) in proc.stdout and (tmp / kept / "config.json").is_file()
    assert f"{tmp / kept} is kept for this command" in proc.stderr
