"""A replaced file is the old one or the new one, whole; a failed or killed writer leaves no trace but a .partial."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from maxtext_compat.atomic_file import PARTIAL_GLOB, replacing
from maxtext_compat.runner.caches import PRUNED_CACHES


def test_the_block_writes_a_sibling_that_replaces_the_file(tmp_path):
    target = tmp_path / "answer.npz"
    target.write_bytes(b"old")
    with replacing(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target and tmp.match(PARTIAL_GLOB)
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # a reader still sees the old file, whole
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answer.npz"]


def test_a_failed_block_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "answer.npz"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half"), replacing(target) as tmp:
        tmp.write_bytes(b"ne")
        raise RuntimeError("half written")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answer.npz"]


def test_mode_is_given_to_the_new_file(tmp_path):
    target = tmp_path / "m.py"
    with replacing(target, mode=0o640) as tmp:
        tmp.write_text("x = 1\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_killed_writer_leaves_a_file_the_cache_pruning_removes(tmp_path):
    """SIGKILL runs no cleanup: what is left must match the pruned patterns of every cache that uses it."""
    code = (
        "import os, signal, sys\nfrom pathlib import Path\nfrom maxtext_compat.atomic_file import replacing\n"
        "with replacing(Path(sys.argv[1])) as tmp:\n    tmp.write_bytes(b'ne')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    target = tmp_path / "ref.safetensors"
    subprocess.run([sys.executable, "-c", code, str(target)], check=False)
    left = [p for p in tmp_path.iterdir()]
    assert not target.exists() and len(left) == 1
    assert all(PARTIAL_GLOB in patterns for patterns in PRUNED_CACHES.values())
    assert left[0].match(PARTIAL_GLOB)
    assert os.path.getsize(left[0]) == 2
