"""selfwheel puts the running maxtext-compat into another environment: the same version, the same bytes.

Why for real: a wheel packed by hand is only right if an installer takes it and lays down the same files, entry
points included. The project's own wheel is built once, installed (not editable) into a first environment, and
that install rebuilds itself into a second one; the two installs are then compared file by file. The installs
use --no-deps (only maxtext-compat's own files are compared), so nothing but uv's cache is needed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.shipped import REPO
from maxtext_compat.runner.selfwheel import self_install_args

pytestmark = [
    pytest.mark.envs("unit"),  # builds a wheel and throwaway environments: once per matrix run is enough
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is installed by `make envs`"),
]

SELF_ARGS = (
    "import json, sys\nfrom pathlib import Path\nfrom maxtext_compat.runner.selfwheel import self_install_args\n"
    "print(json.dumps(self_install_args(Path(sys.argv[1]))))"
)
# Written by the installer (uv adds uv_cache.json), so never the same in two installs.
INSTALL_TIME = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json", "uv_build.json"}
# What the installed files are, read from the dist-info's RECORD and the files themselves (no import needed).
INSTALLED = """
import hashlib, json, sysconfig
from importlib import metadata
dist = metadata.distribution("maxtext-compat")
files = {}
for f in dist.files:
    if f.parts[0] == "maxtext_compat" or f.parts[0].endswith(".dist-info"):
        files["/".join(f.parts)] = [hashlib.sha256(dist.locate_file(f).read_bytes()).hexdigest(),
                                    f.hash.value if f.hash else None]
groups = {g: sorted(e.name for e in metadata.entry_points(group=g))
          for g in ("pytest11", "vllm.general_plugins", "console_scripts")}
print(json.dumps({"files": files, "entry_points": groups, "version": dist.version}))
"""


def _env() -> dict[str, str]:
    """This process's environment without what would make a child import the checkout or download a Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAXTEXT_COMPAT_MATRIX", "VIRTUAL_ENV")}
    return env | {"UV_PYTHON_DOWNLOADS": "never"}


def _run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("env", _env())
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)
    assert done.returncode == 0 or kw.get("check") is False, f"{cmd}: {done.stderr[-3000:]}"
    return done


def _venv(path: Path) -> Path:
    _run(shutil.which("uv"), "venv", "--quiet", "--python", sys.executable, path)
    return path / "bin" / "python"


def _install(python: Path, *args: str) -> None:
    _run(shutil.which("uv"), "pip", "install", "--quiet", "--no-deps", "--python", python, *args)


def _installed(python: Path) -> dict:
    return json.loads(_run(python, "-c", INSTALLED, cwd=python.parent).stdout)


def _self_args(python: Path, folder: Path) -> tuple[str, ...]:
    return tuple(json.loads(_run(python, "-c", SELF_ARGS, folder, cwd=folder.parent).stdout))


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """The python of an environment where the project's own wheel is installed, not editable."""
    root = tmp_path_factory.mktemp("selfwheel")
    _run(shutil.which("uv"), "build", "--wheel", "--quiet", "--out-dir", root / "dist", REPO)
    (wheel,) = (root / "dist").glob("maxtext_compat-*.whl")
    python = _venv(root / "first")
    _install(python, str(wheel))
    return python


def _compared(info: dict) -> dict[str, str]:
    """Each shipped file's content hash: install-time files (RECORD, the installer's) are not the package."""
    return {name: sha for name, (sha, _) in info["files"].items() if name.rsplit("/", 1)[-1] not in INSTALL_TIME}


def test_a_wheel_install_lands_in_another_environment_with_the_same_files(first, tmp_path):
    args = _self_args(first, tmp_path / "self")
    (requirement,) = args
    name, _, url = requirement.partition(" @ ")
    assert name == "maxtext-compat[test]" and url.startswith("file://")
    wheel = Path(url.removeprefix("file://"))
    assert wheel.is_file() and wheel.is_relative_to(tmp_path / "self")
    assert wheel.name == "maxtext_compat-{}-py3-none-any.whl".format(_installed(first)["version"])

    # The wheel's own RECORD is right: every member listed once, with its hash and size.
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (record,) = [n for n in names if n.endswith(".dist-info/RECORD")]
        rows = [line.split(",") for line in zf.read(record).decode().splitlines()]
        assert {r[0] for r in rows} == names and [r[0] for r in rows].count(record) == 1
        for path, digest, size in rows:
            if path == record:
                assert (digest, size) == ("", "")
                continue
            data = zf.read(path)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={sha}", str(len(data))), path
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    second = _venv(tmp_path / "second")
    _install(second, *args)
    before, after = _installed(first), _installed(second)
    assert _compared(after) == _compared(before)
    assert len(_compared(after)) > 50 and "maxtext_compat/compat_matrix.yaml" in _compared(after)
    # What the second install's RECORD says about each file is what the file holds.
    for path, (sha, recorded) in after["files"].items():
        if recorded is not None:
            padded = recorded + "=" * (-len(recorded) % 4)
            assert base64.urlsafe_b64decode(padded).hex() == sha, path

    assert after["entry_points"] == before["entry_points"]
    assert after["entry_points"]["pytest11"] == ["maxtext_compat"]
    assert after["entry_points"]["vllm.general_plugins"] == ["maxtext_compat"]
    assert "maxtext-compat" in after["entry_points"]["console_scripts"]
    assert (second.parent / "maxtext-compat").is_file()
    version = "import maxtext_compat; print(maxtext_compat.__version__)"
    assert _run(second, "-c", version).stdout == _run(first, "-c", version).stdout == before["version"] + "\n"


def test_the_wheel_is_built_once_per_content(first, tmp_path):
    folder = tmp_path / "self"
    (one,) = _self_args(first, folder)
    wheel = Path(one.partition(" @ ")[2].removeprefix("file://"))
    stamp = wheel.stat().st_mtime_ns
    assert _self_args(first, folder) == (one,) and wheel.stat().st_mtime_ns == stamp
    assert not [p for p in folder.rglob("*") if p.is_file() and p != wheel]  # no temporary file left behind

    marker = Path(_run(first, "-c", "import maxtext_compat; print(maxtext_compat.__file__)").stdout.strip())
    typed = marker.parent / "py.typed"
    original = typed.read_bytes()
    try:
        typed.write_bytes(original + b"# changed\n")  # an installed file changed: a new wheel
        (two,) = _self_args(first, folder)
    finally:
        typed.write_bytes(original)
    assert two != one and Path(two.partition(" @ ")[2].removeprefix("file://")).is_file()


def test_a_checkout_on_pythonpath_is_not_the_installed_one(first, tmp_path):
    env = _env() | {"PYTHONPATH": str(REPO / "src")}
    done = _run(first, "-c", SELF_ARGS, tmp_path / "self", env=env, check=False)
    assert done.returncode != 0
    assert "EnvironmentBuildError" in done.stderr and "not the installed one" in done.stderr
    assert str(REPO / "src" / "maxtext_compat") in done.stderr


def test_an_editable_install_is_installed_editable_from_its_source(tmp_path):
    """This environment (dev, unit: every one of this repository's) has the checkout installed editable."""
    assert self_install_args(tmp_path) == ("-e", f"{REPO}[test]")
    assert self_install_args(tmp_path, extras="") == ("-e", str(REPO))
    assert not list(tmp_path.iterdir())  # no wheel is built for an editable install
