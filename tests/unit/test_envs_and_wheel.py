"""Environments are built by uv from the YAML (rebuild is a no-op, a changed spec rebuilds),
and the wheel carries compat_matrix.yaml so an installed package finds it without the repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile

import pytest
from env_specs import tiny_spec

from helpers.shipped import REPO
from maxtext_compat import envs
from maxtext_compat.errors import EnvironmentBuildError

pytestmark = [
    pytest.mark.envs("unit"),  # builds throwaway environments and a wheel: once per matrix run is enough
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is installed by `make envs`"),
]


_spec = tiny_spec


@pytest.fixture
def envs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENVS_DIR_VAR, str(tmp_path / "envs"))
    return tmp_path / "envs"


def test_build_then_noop_then_rebuild_on_spec_change(envs_dir):
    logs: list[str] = []
    spec = _spec()
    assert not envs.status(spec).built
    st = envs.build(spec, log=logs.append)
    assert st.built and st.up_to_date
    marker = envs_dir / "tiny" / envs.MARKER
    data = json.loads(marker.read_text())
    assert data["spec"]["requirements"] == ["six==1.17.0"]
    py = envs.env_python("tiny")
    version = subprocess.run([py, "-c", "import six; print(six.__version__)"], capture_output=True, text=True)
    assert version.stdout.strip() == "1.17.0"
    # The project itself is installed (editable) with its test extras.
    assert subprocess.run([py, "-c", "import maxtext_compat, pytest"], check=False).returncode == 0

    mtime = marker.stat().st_mtime_ns
    envs.build(spec, log=logs.append)
    assert "up to date" in logs[-1]
    assert marker.stat().st_mtime_ns == mtime

    changed = _spec(requirements=("six==1.16.0",))
    assert envs.status(changed).built and not envs.status(changed).up_to_date
    envs.build(changed, log=logs.append)
    assert "spec changed" in " ".join(logs)
    version = subprocess.run([py, "-c", "import six; print(six.__version__)"], capture_output=True, text=True)
    assert version.stdout.strip() == "1.16.0"


def test_failed_build_is_a_typed_error_and_leaves_no_marker(envs_dir):
    spec = _spec(name="broken", requirements=("six==999.0",))
    with pytest.raises(EnvironmentBuildError) as e:
        envs.build(spec, log=lambda _: None)
    assert "broken" in str(e.value) and "six" in str(e.value)
    assert not (envs_dir / "broken" / envs.MARKER).exists()
    assert not envs.status(spec).built


def test_spec_hash_depends_on_every_field():
    a = envs.spec_hash(_spec())
    assert a == envs.spec_hash(_spec())
    for change in ({"overrides": ("six==1.16.0",)}, {"no_deps": ("six",)}, {"exclude_newer": None},
                   {"python": "3.13"}, {"env": {"X": "1"}}):  # fmt: skip
        assert envs.spec_hash(_spec(**change)) != a, change


def test_find_python_honours_the_override_and_explains_failure(monkeypatch):
    assert envs.find_python("3.12")
    monkeypatch.setenv(envs.PYTHON_VAR, "/nonexistent/python")
    assert envs.find_python("3.12")  # falls through to the next candidate
    with pytest.raises(EnvironmentBuildError, match=r"no Python 3\.99"):
        envs.find_python("3.99")


def test_wheel_ships_the_matrix_and_finds_it_without_the_repo(tmp_path):
    uv = shutil.which("uv")
    dist = tmp_path / "dist"
    py = envs.find_python("3.12")
    subprocess.run([uv, "build", "--wheel", "--quiet", "--python", py, "-o", str(dist), str(REPO)], check=True)
    (wheel,) = dist.glob("maxtext_compat-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "maxtext_compat/compat_matrix.yaml" in names
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", py, str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "MAXTEXT_COMPAT_MATRIX"}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import maxtext_compat as m; x = m.load_matrix(); print(x.source); "
         "print(m.resolve({'maxtext': '0.2.5'}).convention)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "site-packages" in out[0] and out[0].endswith("maxtext_compat/compat_matrix.yaml")
    assert out[1] == "kv_scan_carry"
