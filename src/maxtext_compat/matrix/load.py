"""Finding and reading compat_matrix.yaml: a regular, bounded file, parsed once per version of it."""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

from maxtext_compat.errors import MatrixError
from maxtext_compat.matrix.parse import parse_environments, parse_matrix
from maxtext_compat.matrix.types import CompatMatrix
from maxtext_compat.matrix.values import MATRIX_ENV_VAR

# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def default_matrix_path() -> Path:
    """Where the matrix lives: $MAXTEXT_COMPAT_MATRIX, the wheel's copy, or the repo root."""
    override = os.environ.get(MATRIX_ENV_VAR)
    if override:
        return Path(override)
    packaged = resources.files("maxtext_compat").joinpath("compat_matrix.yaml")
    if packaged.is_file():
        return Path(str(packaged))
    repo_copy = Path(__file__).resolve().parents[3] / "compat_matrix.yaml"
    return repo_copy


MAX_MATRIX_BYTES = 1 << 20  # 1 MiB; the shipped matrix is ~30 kB (a bigger file is no matrix, and slow to parse)


def load_matrix(path: str | os.PathLike[str] | None = None) -> CompatMatrix:
    """Load and validate a matrix file (cached per path, modification time and size).

    Only a regular file of at most MAX_MATRIX_BYTES is read: a FIFO, a device (/dev/zero) or a
    directory would otherwise hang every command or exhaust memory."""
    p = Path(path) if path is not None else default_matrix_path()
    try:
        st = p.stat()
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        raise MatrixError(
            "compat matrix file not found",
            path=str(p),
            fix=f"set {MATRIX_ENV_VAR} to an existing file, or reinstall maxtext-compat",
        ) from None
    _check_regular(str(p), st)
    return _load_cached(str(p), st.st_mtime_ns, st.st_size)


def _check_regular(path: str, st: os.stat_result) -> None:
    import stat as stat_mod

    if not stat_mod.S_ISREG(st.st_mode):
        kind = (
            "a directory" if stat_mod.S_ISDIR(st.st_mode)
            else "a FIFO" if stat_mod.S_ISFIFO(st.st_mode)
            else "a device" if stat_mod.S_ISCHR(st.st_mode) or stat_mod.S_ISBLK(st.st_mode)
            else "a socket" if stat_mod.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )  # fmt: skip
        raise MatrixError(
            "the compat matrix must be a regular file",
            path=path,
            expected="a YAML file",
            found=kind,
            fix=f"point {MATRIX_ENV_VAR} at a compat_matrix.yaml file",
        )
    _check_size(path, st.st_size)


def _check_size(path: str, size: int) -> None:
    if size > MAX_MATRIX_BYTES:
        raise MatrixError(
            "the compat matrix file is too large",
            path=path,
            expected=f"at most {MAX_MATRIX_BYTES} bytes",
            found=f"{size} bytes or more",
            fix=f"point {MATRIX_ENV_VAR} at a compat_matrix.yaml file",
        )


def with_environments(matrix: CompatMatrix, path: str | os.PathLike[str]) -> CompatMatrix:
    """`matrix` with the environments of a layout file (this repository's tests/environments.yaml)."""
    p = str(path)
    try:
        st = Path(p).stat()
    except (OSError, ValueError):
        raise MatrixError("environments file not found", path=p, fix="pass tests/environments.yaml's path") from None
    _check_regular(p, st)
    return parse_environments(_read_text(p), p, matrix)


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, _mtime: int, _size: int) -> CompatMatrix:
    return parse_matrix(_read_text(path), path)


def _read_text(path: str) -> str:
    try:
        # O_NONBLOCK: if the path became a FIFO since stat(), open() must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            _check_regular(path, os.fstat(f.fileno()))
            data = f.read(MAX_MATRIX_BYTES + 1)
        _check_size(path, len(data))  # it may have grown since stat()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"cannot read the file: {exc}", path=path, fix="check the file") from None
    return text
