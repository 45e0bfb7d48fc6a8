"""Every shim of the package is declared under the `maxtext_compat.shims` entry point group, with a verified range
that is a requirement string holding every release the compat matrix lists; a fresh `maxtext-compat doctor --json`
lists each one from those entry points, with its status and range.

Why a dist-info written here: the environments install this package editable from one checkout, and entry points
are read from the installed metadata, which a change to pyproject.toml reaches only on reinstall. The fresh process
gets a dist-info built from this checkout's pyproject.toml on its path, so `importlib.metadata` finds the group
exactly as an install would write it (entry_points.txt), and the doctor's discovery runs unmodified.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from maxtext_compat import names
from maxtext_compat.matrix import load_matrix
from maxtext_compat.patching.shim import ENTRY_POINTS, NOT_ASKED, Shim

pytestmark = pytest.mark.envs("unit")

REPO = Path(__file__).resolve().parents[2]
DECLARED: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINTS]
SHIM_NAMES = {
    names.VLLM_BACKPORT,
    names.KNOWN_DEFECTS,
    names.CALL_RULE,
    names.BACKPORT_HOOKS,
    names.CPU_RPA,
    names.CPU_SERVING,
    names.SERVING_REQUESTS,
    names.SERVING_OUTPUT_HEAD,
    names.PLUGIN_CONFIG,
}


def _load(value: str) -> type[Shim]:
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def test_every_shim_name_is_declared_by_a_shim_class_of_that_name():
    assert set(DECLARED) == SHIM_NAMES
    for name, value in DECLARED.items():
        cls = _load(value)
        assert issubclass(cls, Shim) and cls.name == name, value
        assert cls.verified_for and all(Requirement(r) for r in cls.verified_for), value


def test_every_shim_class_in_the_package_is_declared():
    """A Shim subclass added to the package without its entry point would be missing from a fresh doctor."""
    src = REPO / "src"
    found = set()
    for path in (src / "maxtext_compat").rglob("*.py"):
        text = path.read_text()
        if "Shim)" not in text:
            continue
        module = importlib.import_module(".".join(path.relative_to(src).with_suffix("").parts))
        found |= {
            f"{module.__name__}:{k}"
            for k, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Shim) and v.__module__ == module.__name__ and "name" in vars(v)
        }
    assert found == set(DECLARED.values())


def test_the_verified_ranges_hold_every_release_the_matrix_lists():
    m = load_matrix()
    maxtext, tpu, jax = (Requirement(r) for r in (names.MAXTEXT_RELEASES, names.TPU_INFERENCE_RELEASES,
                                                   names.CPU_JAX_RELEASES))  # fmt: skip
    assert [r.name for r in m.maxtext if not maxtext.specifier.contains(Version(r.name))] == []
    releases = [v for row in m.tpu_inference for v in row.releases] + list(m.cpu_shim.verified_tpu_inference)
    assert [v for v in releases if not tpu.specifier.contains(Version(v))] == []
    assert [v for v in m.cpu_shim.verified_jax if not jax.specifier.contains(Version(v))] == []


def test_a_fresh_doctor_lists_every_declared_shim_with_its_status_and_range(tmp_path):
    info = tmp_path / "maxtext_compat_shims_declared-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: maxtext-compat-shims-declared\nVersion: 0\n")
    lines = [f"[{ENTRY_POINTS}]", *(f"{k} = {v}" for k, v in DECLARED.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "doctor", "--json"],
        capture_output=True, text=True, env=env, check=False, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    listed = {s["name"]: s for s in json.loads(out.stdout)["shims"]}
    assert set(listed) >= SHIM_NAMES
    for name, value in DECLARED.items():
        s = listed[name]
        assert not s["active"] and s["reason"] == NOT_ASKED and s["targets"] == [], s
        assert s["verified_for"] == list(_load(value).verified_for), s
