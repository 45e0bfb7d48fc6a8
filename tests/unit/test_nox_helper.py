"""maxtext_compat.runner.nox registers the sessions a downstream noxfile asks for, and each installs what `pins` names.

Why nox's own machinery: the session list a user sees is what `nox --list` prints from their noxfile, so the
noxfile is read by nox in a child process. What one session installs is checked on a stand-in for nox's
Session (building MaxText's stacks here would take minutes; a real run over MaxText is another test's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.shipped import REPO, shipped_matrix
from maxtext_compat.errors import MatrixError
from maxtext_compat.runner import pinsets
from maxtext_compat.runner.nox import compat_sessions

pytestmark = pytest.mark.envs("unit")


def _nox(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(f"from maxtext_compat.runner.nox import compat_sessions\n\n{body}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("MAXTEXT_COMPAT_MATRIX", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "nox", "-f", str(noxfile), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_nox_lists_one_session_per_pin_set_on_its_python(tmp_path):
    done = _nox(tmp_path, 'compat_sessions(["0.1.0", "0.2.5"])\ncompat_sessions(name="every")', "--list", "--json")
    assert done.returncode == 0, done.stderr
    listed = [(s["session"], s["name"], s["python"], s["call_spec"]) for s in json.loads(done.stdout)]
    m = shipped_matrix()
    assert listed[:2] == [
        ("compat(maxtext-0.1.0)", "compat", m.pin_set("0.1.0").python, {"release": "maxtext-0.1.0"}),
        ("compat(maxtext-0.2.5)", "compat", m.pin_set("0.2.5").python, {"release": "maxtext-0.2.5"}),
    ]
    # Without releases: every pin set of the matrix, in its order.
    every = [(session, python) for session, name, python, _ in listed[2:] if name == "every"]
    assert every == [(f"every({key})", spec.python) for key, spec in m.pin_sets.items()]
    assert len(listed) == 2 + len(m.pin_sets)
    # `nox -s compat` selects both of the first; `-p` filters by the sets' Python.
    selected = _nox(tmp_path, 'compat_sessions(["0.1.0", "0.2.5"])', "--list", "--json", "-s", "compat")
    assert [s["session"] for s in json.loads(selected.stdout)] == ["compat(maxtext-0.1.0)", "compat(maxtext-0.2.5)"]


def test_an_unknown_release_fails_reading_the_noxfile_naming_the_known_ones(tmp_path):
    done = _nox(tmp_path, 'compat_sessions(["0.2.5", "9.9"])', "--list")
    assert done.returncode != 0
    text = " ".join(done.stderr.split())
    assert "MatrixError" in text and "no pin set named '9.9'" in text, done.stderr
    known = sorted({p.maxtext for p in shipped_matrix().pin_sets.values() if p.maxtext})
    assert f"a MaxText release with a tested set ({', '.join(known)})" in text
    with pytest.raises(MatrixError, match=r"no pin set named '9\.9'"):  # in-process: the same typed error
        compat_sessions(["9.9"])


class FakeSession:
    """What a session function uses of nox's Session: records installs and runs instead of running them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.posargs = tmp, ["-k", "smoke"]
        self.installs: list[tuple[str, ...]] = []
        self.runs: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def create_tmp(self) -> str:
        self.tmp.mkdir(parents=True, exist_ok=True)
        return str(self.tmp)

    def install(self, *args: str) -> None:
        self.installs.append(args)

    def run(self, *args: str, env: dict[str, str]) -> None:
        self.runs.append((args, env))


@pytest.fixture
def registry(monkeypatch):
    """nox's session registry, empty for this test (compat_sessions registers into it as a noxfile would)."""
    import nox.registry  # here, not at the top: the module is collected (then deselected) where nox is absent

    monkeypatch.setattr(nox.registry, "_REGISTRY", {})
    return nox.registry


def test_a_session_installs_the_set_then_maxtext_compat_then_the_project(tmp_path, registry, monkeypatch):
    compat_sessions(["0.2.5"], name="down", extras="test", pytest_args=["-x", "tests"], project="../proj")
    func = registry.get()["down"]
    assert func.venv_backend == "uv"
    assert [(str(p), p.args) for p in func.parametrize] == [("maxtext-0.2.5", ("3.12", "maxtext-0.2.5"))]

    spec = shipped_matrix().pin_set("0.2.5")
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")  # the caller's own value wins over the set's default
    for key in spec.env.keys() - {"JAX_PLATFORMS"}:  # the others are the set's (a TPU VM's shell may set them)
        monkeypatch.delenv(key, raising=False)
    fake = FakeSession(tmp_path / "tmp")
    func.func(fake, "maxtext-0.2.5")

    pins = tmp_path / "tmp" / "pins"
    steps = pinsets.install_steps(spec, pins)
    assert fake.installs[: len(steps)] == [s.args for s in steps]
    for name, lines in (f for s in steps for f in s.files):
        assert (pins / name).read_text().splitlines() == list(lines)
    ours, project = fake.installs[len(steps) :]
    common = ["--exclude-newer", spec.exclude_newer, "--override", str(tmp_path / "tmp" / "project" / "overrides.txt")]
    assert ours == ("-e", f"{REPO}[test]", *common)  # this checkout is installed editable here
    constraints = tmp_path / "tmp" / "project" / "constraints.txt"
    assert project == ("-e", "../proj[test]", "-c", str(constraints), *common)
    assert constraints.read_text().splitlines() == list(pinsets.constraint_lines(spec))
    assert "maxtext==0.2.5" in constraints.read_text().splitlines()

    ((args, env),) = fake.runs
    assert args == ("python", "-m", "pytest", "-x", "tests", "-k", "smoke")
    assert env == {k: v for k, v in spec.env.items() if k != "JAX_PLATFORMS"} and "TPU_NAME" in env


def test_the_same_set_named_twice_is_one_session(registry):
    compat_sessions(["0.2.5", "maxtext-0.2.5", "0.1.0"])
    assert [str(p) for p in registry.get()["compat"].parametrize] == ["maxtext-0.2.5", "maxtext-0.1.0"]
