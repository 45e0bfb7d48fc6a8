"""Temporary directories removed when their owner is done: nothing of ours stays behind in $TMPDIR.

Why one helper: every MaxText config needs a `base_output_directory` (the tiny models, each served or converted
model) and `serve --tiny` needs a model directory; each was a `mkdtemp` nobody removed, and one
`make demo` + `make test` + `make bench` left 726 of them (issue 39). Three owners, three lifetimes:

- `make(prefix)`: a directory this process removes at exit at the latest (its fallback for every owner);
- `own(path, owner)`: removed as soon as `owner` (a config) is garbage-collected, so a long pytest session or a
  server that builds many configs does not collect them until it exits; `for_result(prefix, build)` does both
  for an owner that needs the directory to be built (a MaxText config);
- `hand_to_exec(path)`: a process about to `exec` (`maxtext-compat serve`) runs no exit handler; a watcher
  process removes the directory once the program exec'd and every process forked from it have exited;
- `release(path)`: the directory becomes the user's (`serve --tiny --dry-run` prints a command that names it).

Only the process that made a directory removes it: a forked child (vLLM's engine core, a multiprocessing worker)
inherits the records but neither its exit nor its garbage collector removes its parent's directory.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# path -> the pid of the process that made it (and removes it)
_LIVE: dict[str, int] = {}
_WATCHERS: list[Any] = []  # the watcher processes hand_to_exec started

# The watcher of `hand_to_exec`: reads its stdin (a pipe) until every copy of the write end is closed, then removes.
_WATCH = "import os, shutil, sys\nwhile os.read(0, 1):\n    pass\nshutil.rmtree(sys.argv[1], ignore_errors=True)\n"


def make(prefix: str) -> str:
    """A new directory under $TMPDIR (tempfile's rules), removed when this process exits at the latest."""
    path = tempfile.mkdtemp(prefix=prefix)
    _LIVE[path] = os.getpid()
    return path


def own(path: str, owner: object) -> None:
    """Remove `path` (from `make`) once `owner` is garbage-collected; an owner that takes no weak reference
    leaves it to the exit."""
    with contextlib.suppress(TypeError):  # e.g. a class with __slots__ and no __weakref__
        weakref.finalize(owner, remove, path)


def for_result(prefix: str, build: Callable[[str], T]) -> T:
    """`build(path)` with a new directory, which is removed with what `build` returns (`own`), or at once if it
    raises."""
    path = make(prefix)
    try:
        result = build(path)
    except BaseException:
        remove(path)
        raise
    own(path, result)
    return result


def remove(path: str) -> None:
    """Remove `path` now if this process made it (from `make`); a forked child's call does nothing."""
    if _LIVE.get(path) == os.getpid() and _LIVE.pop(path, None) is not None:
        shutil.rmtree(path, ignore_errors=True)


def release(path: str) -> None:
    """Nothing of ours removes `path` any more: it is the user's now."""
    _LIVE.pop(path, None)


def hand_to_exec(path: str) -> None:
    """Before `os.exec*`: a watcher removes `path` once the exec'd program and every process it forked have exited
    (killed included). The watcher holds the read end of a pipe whose write end crosses the exec; it runs in its own
    session, so Ctrl-C or a signal to the server's process group does not stop it before it has removed `path`."""
    import subprocess
    import sys

    read, write = os.pipe()
    try:
        watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCH, path],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    _WATCHERS.append(watcher)  # kept: a dropped Popen of a running process warns (ResourceWarning)
    os.set_inheritable(write, True)  # os.pipe's ends close on exec by default
    release(path)  # the watcher's now; an exec that fails returns here, and this process's exit closes `write`


@atexit.register
def _remove_all() -> None:
    for path in list(_LIVE):
        remove(path)
