"""Build a workspace's environments with uv: a pin set (or a CI environment) plus what the workspace installs.

Why uv and a spec hash: the real environments hold up to ~10 GB of wheels (vllm-tpu,
torch, CUDA libraries). uv hard-links them from its cache, so a rebuild costs seconds,
and a hash of the environment's entry plus what goes on top (this checkout's dependencies;
in a user's project, theirs and the installed maxtext-compat) tells an up-to-date
environment (no-op) from one whose spec changed (rebuilt).

Why build beside and swap: a build that fails or is interrupted (Ctrl-C, a kill) must leave
either the previous environment, whole, or none, never a half-built one that looks built.
Each build holds a per-environment lock (two builds of one environment wait for each other),
creates a relocatable venv in a hidden folder beside the target, writes the marker last, and
swaps it into place by rename, removing the old environment's marker first. Nothing is ever
deleted outside the envs folder: names are single plain directory names and every deletion
is checked to lie strictly inside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from maxtext_compat.errors import EnvironmentBuildError, InvalidArgumentError
from maxtext_compat.matrix import ENV_NAME_RULE, CompatMatrix, EnvironmentSpec, valid_env_name
from maxtext_compat.runner import pinsets, workspace
from maxtext_compat.runner.workspace import (
    ENVS_DIR_VAR as ENVS_DIR_VAR,  # re-exported: the variable's home is workspace
)
from maxtext_compat.runner.workspace import Workspace

PYTHON_VAR = "MAXTEXT_COMPAT_PYTHON"
MARKER = "maxtext-compat-env.json"
BUILDER_VERSION = 1  # bump to force every environment to rebuild


def project_root() -> Path:
    """The source checkout this package runs from (this repository's own CI files live there)."""
    root = workspace.checkout_root()
    if root is None:
        raise EnvironmentBuildError(
            "this command needs the maxtext-compat source checkout, and none was found",
            expected=f"pyproject.toml, compat_matrix.yaml and {workspace.CI_LAYOUT} beside the package",
            fix="run `maxtext-compat matrix` in your own project instead (it builds the shipped pin sets there)",
        )
    return root


def _ws(ws: Workspace | None) -> Workspace:
    return ws if ws is not None else workspace.default()


def envs_dir(ws: Workspace | None = None) -> Path:
    return _ws(ws).envs_dir


def check_env_name(name: object) -> str:
    """`name` if it can name an environment; a typed error otherwise (it becomes a directory name)."""
    if not valid_env_name(name):
        raise InvalidArgumentError(
            "is not a valid environment name",
            argument="environment name",
            expected=ENV_NAME_RULE,
            found=repr(name),
            fix="pass a name listed by `maxtext-compat envs`, e.g. maxtext-0.2.5",
        )
    assert isinstance(name, str)
    return name


def env_path(name: str, ws: Workspace | None = None) -> Path:
    return envs_dir(ws) / check_env_name(name)


def env_python(name: str, ws: Workspace | None = None) -> Path:
    return env_path(name, ws) / "bin" / "python"


@dataclass(frozen=True)
class EnvStatus:
    name: str
    path: str
    built: bool
    up_to_date: bool
    spec_hash: str
    python: str | None = None
    duration_s: float | None = None

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def spec_hash(spec: EnvironmentSpec, ws: Workspace | None = None) -> str:
    """Hash of everything that decides the environment's contents: the pins, and what the workspace installs on
    top of them (this checkout's dependencies; in a user's project, theirs, their extras and our installed files)."""
    payload = json.dumps(
        {"spec": spec.as_dict(), **_ws(ws).identity, "builder": BUILDER_VERSION}, sort_keys=True
    ).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def status(spec: EnvironmentSpec, ws: Workspace | None = None) -> EnvStatus:
    ws = _ws(ws)
    path = env_path(spec.name, ws)
    marker = path / MARKER
    want = spec_hash(spec, ws)
    if not marker.is_file() or not (path / "bin" / "python").exists():
        return EnvStatus(spec.name, str(path), False, False, want)
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return EnvStatus(spec.name, str(path), False, False, want)
    return EnvStatus(
        spec.name,
        str(path),
        True,
        data.get("spec_hash") == want,
        want,
        data.get("python"),
        data.get("duration_s"),
    )


# --------------------------------------------------------------------------------------------
# Tools: a Python interpreter of the wanted version, and uv
# --------------------------------------------------------------------------------------------


def _python_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.split()  # fmt: skip
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def find_python(version: str) -> str:
    """An interpreter of exactly `version` (e.g. "3.12"): env override, PATH, pyenv, this one."""
    want = tuple(int(x) for x in version.split(".")[:2])
    candidates: list[str] = []
    if os.environ.get(PYTHON_VAR):
        candidates.append(os.environ[PYTHON_VAR])
    base = getattr(sys, "_base_executable", sys.executable)
    candidates += [base, sys.executable]
    for name in (f"python{version}", "python3"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    versions_dir = Path(pyenv_root) / "versions"
    if versions_dir.is_dir():
        for d in sorted(versions_dir.glob(f"{version}*"), reverse=True):
            candidates.append(str(d / "bin" / f"python{version}"))
    for exe in candidates:
        if exe and _python_version(exe) == want:
            return exe
    raise EnvironmentBuildError(
        f"no Python {version} interpreter found",
        expected=f"Python {version}",
        found=", ".join(dict.fromkeys(candidates)) or "no candidates",
        fix=f"install Python {version} (e.g. `pyenv install {version}`) or set {PYTHON_VAR} to its path",
    )


def find_uv() -> list[str]:
    exe = shutil.which("uv")
    if exe:
        return [os.path.abspath(exe)]  # PATH may hold a relative folder (the Makefile's .tools/bin)
    try:
        import uv  # type: ignore[import-not-found]

        return [uv.find_uv_bin()]
    except ImportError:
        pass
    raise EnvironmentBuildError(
        "uv is not installed",
        fix="`python3 -m pip install uv` (the Makefile does this for you: `make envs`)",
    )


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


def build(
    spec: EnvironmentSpec, *, force: bool = False, log: Callable[[str], None] = print, ws: Workspace | None = None
) -> EnvStatus:
    """Create or refresh one environment; a no-op when it is up to date.

    Under the environment's lock the status is read again (a build that waited for another one
    finds it done), then a new environment is built beside the old one and swapped in. On any
    failure or interrupt the old environment stays as it was and the new one is deleted."""
    name = check_env_name(spec.name)
    ws = _ws(ws)
    root = envs_dir(ws)
    with env_lock(name, log, ws):
        current = status(spec, ws)
        if current.up_to_date and not force:
            log(f"[envs] {name}: up to date ({current.path})")
            return current
        path = Path(current.path)
        _check_replaceable(path, root)
        _remove_leftovers(name, root)
        reason = "forced" if force else ("spec changed" if current.built else "not built")
        log(f"[envs] {name}: building ({reason}) in {current.path}")
        t0 = time.monotonic()
        uv = find_uv()
        python = find_python(spec.python)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
        try:
            new = work / "env"
            _populate(spec, new, uv, python, t0, ws)
            _check_relocated(new, spec)
            _swap(new, path, work)
        finally:
            _remove_inside(work, root)  # the build folder, and the old environment swapped into it
    st = status(spec, ws)
    log(f"[envs] {name}: built in {st.duration_s}s")
    return st


def _populate(spec: EnvironmentSpec, path: Path, uv: list[str], python: str, t0: float, ws: Workspace) -> None:
    """A complete environment at `path`: a relocatable venv, the pin set, maxtext-compat, the user's project (held
    to the set's pins by constraints), the marker last."""
    # --relocatable: scripts find their interpreter relative to themselves, so the venv still
    # works after the rename into place (uv otherwise writes the build path into every shebang).
    _run([*uv, "venv", "--quiet", "--relocatable", "--python", python, str(path)], spec)
    work = path / "maxtext-compat-spec"
    self_args = ws.self_install
    if self_args is None:
        from maxtext_compat.runner import selfwheel

        self_args = selfwheel.self_install_args(ws.state / "self")
    target = ["--python", str(path / "bin" / "python")]
    for args in pinsets.install_plan(spec, work, work, self_args, ws.project_install, ws.maxtext_install):
        _run([*uv, "pip", "install", *target, *args], spec)
    write_marker(path, spec, python, t0, ws)


def write_marker(path: Path, spec: EnvironmentSpec, python: str, t0: float, ws: Workspace | None = None) -> None:
    """The marker that says `path` holds `spec`, complete (written atomically, as the last step)."""
    marker = {
        "name": spec.name,
        "spec_hash": spec_hash(spec, ws),
        "spec": spec.as_dict(),
        "python": python,
        "duration_s": round(time.monotonic() - t0, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "relocatable": True,
    }
    tmp = path / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2), encoding="utf-8")
    tmp.replace(path / MARKER)  # written last: a half-built environment has no marker


def _check_relocated(path: Path, spec: EnvironmentSpec) -> None:
    """No script in bin/ names the build folder (it would break once the folder is renamed)."""
    needle = str(path).encode()
    for f in sorted((path / "bin").iterdir()):
        if f.is_file() and not f.is_symlink():
            with f.open("rb") as fh:
                head = fh.read(4096)
            if needle in head:
                raise EnvironmentBuildError(
                    f"building environment {spec.name!r}: {f.name} hard-codes the build folder",
                    argument="uv",
                    expected="a relocatable venv (`uv venv --relocatable`)",
                    found=f"{f} refers to {path}",
                    fix="upgrade uv (the Makefile pins a version that writes relocatable scripts)",
                )


# Indirection for fault-injection tests (a failure between the two renames of a swap).
_rename = os.rename


def _swap(new: Path, path: Path, work: Path) -> None:
    """Put `new` at `path`; the old environment (if any) goes into `work`, its marker removed first.

    Whatever point a kill interrupts this at, `path` is either the old environment without a
    marker (not built), absent (not built), or the new environment with its marker (built)."""
    if path.exists() or path.is_symlink():
        (path / MARKER).unlink(missing_ok=True)
        _rename(path, work / "old")
    _rename(new, path)


def _check_replaceable(path: Path, root: Path) -> None:
    """An existing folder at `path` must be an environment (ours, or a venv), strictly inside `root`."""
    if not (path.exists() or path.is_symlink()):
        return
    _inside(path, root)
    if not ((path / MARKER).is_file() or (path / "pyvenv.cfg").is_file()):
        raise EnvironmentBuildError(
            f"{path} exists and is not an environment, so it is not replaced",
            argument="environment name",
            expected=f"a folder built by maxtext-compat (with {MARKER}) or a venv (with pyvenv.cfg), or nothing",
            found=f"{path} without either",
            fix=f"move or delete {path} yourself, or rename the environment",
        )


_LEFTOVER = re.compile(r"\.(?P<name>.+)\.build-[a-z0-9_]{8}")


def _remove_leftovers(name: str, root: Path) -> None:
    """Build folders of this environment left by a killed build (the caller holds the lock)."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        m = _LEFTOVER.fullmatch(p.name)
        if m and m["name"] == name and p.is_dir() and not p.is_symlink():
            _remove_inside(p, root)


def _inside(path: Path, root: Path) -> Path:
    """`path`, checked to be a real directory entry directly inside `root` (symlinks resolved)."""
    real_root = Path(os.path.realpath(root))
    if path.is_symlink():
        raise EnvironmentBuildError(
            f"{path} is a symbolic link; maxtext-compat only replaces folders it built",
            argument="environment name",
            expected=f"a folder directly inside {real_root}",
            found=f"{path} -> {os.readlink(path)}",
            fix=f"remove the link {path} yourself (its target is left alone)",
        )
    real = Path(os.path.realpath(path))
    if real.parent != real_root or real.name in ("", ".", ".."):
        raise EnvironmentBuildError(
            f"refusing to delete {real}: it is not strictly inside the envs folder",
            argument="environment name",
            expected=f"a folder directly inside {real_root}",
            found=str(real),
            fix=f"use a plain environment name ({ENV_NAME_RULE})",
        )
    return real


def _remove_inside(path: Path, root: Path) -> None:
    """Delete the folder `path`, which must lie strictly inside `root`; nothing else is ever deleted."""
    if not (path.exists() or path.is_symlink()):
        return
    shutil.rmtree(_inside(path, root))


@contextmanager
def env_lock(name: str, log: Callable[[str], None] = print, ws: Workspace | None = None) -> Iterator[None]:
    """Hold the per-environment build lock (an flock on `.NAME.lock` beside the environment).

    The lock file is never deleted (deleting lock files races); the kernel releases the lock when
    the holder exits, however it exits."""
    import fcntl

    root = envs_dir(ws)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / f".{check_env_name(name)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            log(f"[envs] {name}: waiting for another build of it (pid {holder})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


_NOISE = re.compile(r"maxtext 0\.1\.0 requires|^\s*$")


def _run(cmd: Sequence[str], spec: EnvironmentSpec) -> None:
    # Never let uv fetch an interpreter from the internet: we pass one found on the machine.
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        tail = "\n".join(line for line in (proc.stderr or proc.stdout).splitlines() if not _NOISE.search(line))
        raise EnvironmentBuildError(
            f"building environment {spec.name!r} failed: `{' '.join(cmd)}` exited with {proc.returncode}",
            found=tail[-3000:],
            fix="read the uv output above; check the environment's pins in compat_matrix.yaml",
        )


def build_all(
    names: Sequence[str] | None = None,
    *,
    matrix: CompatMatrix | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
    ws: Workspace | None = None,
) -> list[EnvStatus]:
    ws = _ws(ws)
    m = matrix if matrix is not None else ws.matrix
    specs = [m.environment(n) for n in names] if names else list(m.environments.values())
    return [build(s, force=force, log=log, ws=ws) for s in specs]
