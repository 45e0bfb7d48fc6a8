"""Environments are built by uv from the YAML (rebuild is a no-op, a changed spec rebuilds),
and the wheel carries compat_matrix.yaml (rows and pin sets, not this repository's CI layout) so an installed
package finds it without the repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import zipfile

import pytest
import yaml
from env_specs import tiny_spec

from helpers.shipped import REPO, ci_matrix, lowest_claimed_python
from maxtext_compat.errors import EnvironmentBuildError
from maxtext_compat.matrix.environments import WheelsForPython
from maxtext_compat.runner import envs

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
                   {"python": "3.13"}, {"env": {"X": "1"}},
                   {"wheels_for_python": WheelsForPython("3.12", ("vllm-tpu==0.25.0",))}):  # fmt: skip
        assert envs.spec_hash(_spec(**change)) != a, change


def test_find_python_honours_the_override_and_explains_failure(monkeypatch):
    assert envs.find_python("3.12")
    monkeypatch.setenv(envs.PYTHON_VAR, "/nonexistent/python")
    assert envs.find_python("3.12")  # falls through to the next candidate
    with pytest.raises(EnvironmentBuildError, match=r"no Python 3\.99"):
        envs.find_python("3.99")


def test_wheel_ships_the_matrix_and_finds_it_without_the_repo(tmp_path):
    """Built and installed on the lowest Python the package claims: `import maxtext_compat` works there."""
    uv = shutil.which("uv")
    dist = tmp_path / "dist"
    py = envs.find_python(lowest_claimed_python())
    subprocess.run([uv, "build", "--wheel", "--quiet", "--python", py, "-o", str(dist), str(REPO)], check=True)
    (wheel,) = dist.glob("maxtext_compat-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        shipped = yaml.safe_load(z.read("maxtext_compat/compat_matrix.yaml"))
    assert "maxtext_compat/compat_matrix.yaml" in names
    # The pin sets ship; the CI layout (tests/environments.yaml, its 22 environments) does not, in any form.
    assert "pin_sets" in shipped and "environments" not in shipped
    assert set(shipped["pin_sets"]) == set(ci_matrix().pin_sets)
    assert not [n for n in names if n.endswith("environments.yaml") or n.startswith("tests/")], names
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", py, str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MAXTEXT_COMPAT_MATRIX", "PYTHONPATH")}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import maxtext_compat as m; x = m.load_matrix(); print(x.source); "
         "print(m.resolve({'maxtext': '0.2.5'}).convention); "
         "from maxtext_compat.runner import workspace; "
         "print(len(x.environments), x.pin_set('0.2.5').name, workspace.checkout_root())"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert "site-packages" in out[0] and out[0].endswith("maxtext_compat/compat_matrix.yaml")
    assert out[1] == "kv_scan_carry"
    # Installed, it has the pin sets and no environments, and knows it is not this checkout.
    assert out[2:] == ["0", "maxtext-0.2.5", "None"]
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert version == lowest_claimed_python()
    # One minor version below the claim, the installer refuses the wheel (the claim is declared, not only said).
    major, minor = lowest_claimed_python().split(".")
    below = f"{major}.{int(minor) - 1}"
    old = tmp_path / "below"
    subprocess.run([uv, "venv", "--quiet", "--python", envs.find_python(below), str(old)], check=True)
    refused = subprocess.run([uv, "pip", "install", "--python", str(old / "bin" / "python"), str(wheel)],
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode != 0
    assert f"does not satisfy Python>={lowest_claimed_python()}" in " ".join(refused.stderr.split()), refused.stderr


def test_the_license_ships_in_the_sdist_and_the_wheel(tmp_path):
    """pyproject says Apache-2.0; the text travels with both artifacts (the wheel's from the sdist, as pip builds it),
    the wheel's where PEP 639 puts it (dist-info/licenses), named by its metadata."""
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert "Copyright 2026 The maxtext-compat authors" in text
    dist = tmp_path / "dist"
    py = envs.find_python(lowest_claimed_python())
    subprocess.run([shutil.which("uv"), "build", "--quiet", "--python", py, "-o", str(dist), str(REPO)], check=True)
    (sdist,) = dist.glob("maxtext_compat-*.tar.gz")
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert member is not None and member.read().decode() == text
    (wheel,) = dist.glob("maxtext_compat-*.whl")
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    with zipfile.ZipFile(wheel) as z:
        assert z.read(f"{dist_info}/licenses/LICENSE").decode() == text
        metadata = z.read(f"{dist_info}/METADATA").decode().splitlines()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata


def test_find_python_script_finds_each_version_the_matrix_asks_for():
    """tools/find-python.sh VERSION (the Makefile's) and envs.find_python agree on every environment's Python (the
    CI's environments and the shipped pin sets)."""
    m = ci_matrix()
    wanted = sorted({e.python for e in (*m.environments.values(), *m.pin_sets.values())} | {lowest_claimed_python()})
    assert len(wanted) >= 2, wanted  # the matrix runs the lowest claimed Python and 3.12 (MaxText >= 0.2)
    for version in wanted:
        exe = subprocess.run([str(REPO / "tools" / "find-python.sh"), version], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        ran = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        assert ran == version == ".".join(map(str, envs._python_version(envs.find_python(version)) or ()))
    missing = subprocess.run([str(REPO / "tools" / "find-python.sh"), "3.99"], capture_output=True, text=True)
    assert missing.returncode == 1 and "no Python 3.99 found" in missing.stderr
    bad = subprocess.run([str(REPO / "tools" / "find-python.sh"), "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "major.minor" in bad.stderr


def _wheel_for_python_312_only(folder) -> str:
    """A one-module wheel tagged cp312-none-any (no other Python accepts it), as vllm-tpu's cp312-only wheels."""
    import base64
    import hashlib

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tagged312-1.0-cp312-none-any.whl"
    files = {
        "tagged312.py": "VALUE = 312\n",
        "tagged312-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tagged312\nVersion: 1.0\n",
        "tagged312-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: cp312-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(text.encode())}")
        record.append("tagged312-1.0.dist-info/RECORD,,")
        z.writestr("tagged312-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return f"tagged312 @ {path.as_uri()}"


def test_wheels_for_another_python_install_into_this_one(envs_dir, tmp_path):
    """`wheels_for_python` installs a wheel tagged for Python 3.12 only into a 3.11 environment (vllm-tpu's case in
    tpu-inference-0.25.0); the same pin among the ordinary no_deps is refused by the installer (a typed error)."""
    pin = _wheel_for_python_312_only(tmp_path / "wheels")
    spec = _spec(name="other-python", python="3.11", wheels_for_python=WheelsForPython("3.12", (pin,)))
    envs.build(spec, log=lambda _: None)
    py = envs.env_python("other-python")
    out = subprocess.run([py, "-c", "import sys, tagged312; print(sys.version_info[:2], tagged312.VALUE)"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert out == "(3, 11) 312"
    with pytest.raises(EnvironmentBuildError, match="tagged312"):
        envs.build(_spec(name="same-python", python="3.11", no_deps=(pin,)), log=lambda _: None)
