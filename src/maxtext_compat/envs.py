"""Build the matrix's environments with uv, straight from compat_matrix.yaml.

Why uv and a spec hash: the real environments hold up to ~10 GB of wheels (vllm-tpu,
torch, CUDA libraries). uv hard-links them from its cache, so a rebuild costs seconds,
and a hash of the environment's YAML entry (plus the project's own dependencies) tells
an up-to-date environment (no-op) from one whose spec changed (rebuilt).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from maxtext_compat.errors import EnvironmentBuildError
from maxtext_compat.matrix import CompatMatrix, EnvironmentSpec, load_matrix

ENVS_DIR_VAR = "MAXTEXT_COMPAT_ENVS_DIR"
PYTHON_VAR = "MAXTEXT_COMPAT_PYTHON"
MARKER = "maxtext-compat-env.json"
BUILDER_VERSION = 1  # bump to force every environment to rebuild


def project_root() -> Path:
    """The source checkout this package runs from (environments are built from it)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "compat_matrix.yaml").is_file():
        raise EnvironmentBuildError(
            "environments are built from a source checkout, and none was found",
            expected=f"pyproject.toml and compat_matrix.yaml in {root}",
            fix="run from a clone of maxtext-compat (an installed wheel cannot build the test environments)",
        )
    return root


def envs_dir() -> Path:
    override = os.environ.get(ENVS_DIR_VAR)
    return Path(override) if override else project_root() / ".envs"


def env_path(name: str) -> Path:
    return envs_dir() / name


def env_python(name: str) -> Path:
    return env_path(name) / "bin" / "python"


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


def spec_hash(spec: EnvironmentSpec) -> str:
    """Hash of everything that decides the environment's contents."""
    project = _project_dependencies()
    payload = json.dumps(
        {"spec": spec.as_dict(), "project": project, "builder": BUILDER_VERSION}, sort_keys=True
    ).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def _project_dependencies() -> dict[str, object]:
    import tomllib

    data = tomllib.loads((project_root() / "pyproject.toml").read_text(encoding="utf-8"))
    proj = data.get("project", {})
    # Entry points are recorded at install time: a new plugin or script needs a reinstall too.
    return {
        "dependencies": proj.get("dependencies", []),
        "optional": proj.get("optional-dependencies", {}),
        "scripts": proj.get("scripts", {}),
        "entry_points": proj.get("entry-points", {}),
    }


def status(spec: EnvironmentSpec) -> EnvStatus:
    path = env_path(spec.name)
    marker = path / MARKER
    want = spec_hash(spec)
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
        return [exe]
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


def build(spec: EnvironmentSpec, *, force: bool = False, log: Callable[[str], None] = print) -> EnvStatus:
    """Create or refresh one environment; a no-op when it is up to date."""
    current = status(spec)
    if current.up_to_date and not force:
        log(f"[envs] {spec.name}: up to date ({current.path})")
        return current
    reason = "forced" if force else ("spec changed" if current.built else "not built")
    log(f"[envs] {spec.name}: building ({reason}) in {current.path}")
    t0 = time.monotonic()
    path = Path(current.path)
    uv = find_uv()
    python = find_python(spec.python)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _run([*uv, "venv", "--quiet", "--python", python, str(path)], spec)
    work = path / "maxtext-compat-spec"
    work.mkdir()
    common = ["--python", str(path / "bin" / "python")]
    if spec.exclude_newer:
        common += ["--exclude-newer", spec.exclude_newer]
    if spec.overrides:
        ov = work / "overrides.txt"
        ov.write_text("\n".join(spec.overrides) + "\n", encoding="utf-8")
        common += ["--override", str(ov)]
    if spec.requirements:
        req = work / "requirements.txt"
        req.write_text("\n".join(spec.requirements) + "\n", encoding="utf-8")
        _run([*uv, "pip", "install", *common, "-r", str(req)], spec)
    if spec.no_deps:
        nd = work / "no-deps.txt"
        nd.write_text("\n".join(spec.no_deps) + "\n", encoding="utf-8")
        _run([*uv, "pip", "install", *common, "--no-deps", "-r", str(nd)], spec)
    _run([*uv, "pip", "install", *common, "-e", f"{project_root()}[test]"], spec)
    duration = round(time.monotonic() - t0, 1)
    marker = {
        "name": spec.name,
        "spec_hash": spec_hash(spec),
        "spec": spec.as_dict(),
        "python": python,
        "duration_s": duration,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = path / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2), encoding="utf-8")
    tmp.replace(path / MARKER)  # written last: a half-built environment has no marker
    log(f"[envs] {spec.name}: built in {duration}s")
    return status(spec)


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
) -> list[EnvStatus]:
    m = matrix if matrix is not None else load_matrix()
    specs = [m.environment(n) for n in names] if names else list(m.environments.values())
    return [build(s, force=force, log=log) for s in specs]
