"""Replace a file so that a reader sees the old one or the new one, whole, never a half-written one.

Why one helper: the cache writers (the real model's reference, the cross-era answers) run in several
environments at once, and the migrate codemod rewrites users' files; a writer killed mid-write must leave
the target as it was. The temporary file ends in `.partial`, which the cache pruning also removes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

PARTIAL_SUFFIX = ".partial"
PARTIAL_GLOB = f"*{PARTIAL_SUFFIX}"  # what the cache pruning removes


@contextlib.contextmanager
def replacing(path: Path, *, mode: int | None = None) -> Iterator[Path]:
    """A fresh sibling of `path` to write; renamed over `path` when the block ends, removed when it raises.

    mode: the permission bits to give the new file (default: mkstemp's 0o600)."""
    fd, name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=PARTIAL_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
