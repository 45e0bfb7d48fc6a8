"""`import maxtext_compat` (and resolve/doctor) never import jax, MaxText, tpu-inference, vLLM or torch.

Runs in every environment; it is meaningful where those packages are installed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Meaningful only where the heavy packages are installed: runs in every environment.
pytestmark = pytest.mark.every_env

HEAVY = ("jax", "jaxlib", "flax", "maxtext", "MaxText", "tpu_inference", "vllm", "torch", "tensorflow", "numpy")


def _modules_after(code: str) -> set[str]:
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_import_is_light():
    mods = _modules_after("import maxtext_compat")
    assert not [m for m in HEAVY if m in mods]


def test_resolve_doctor_and_shims_registry_stay_light():
    mods = _modules_after(
        "import maxtext_compat, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "maxtext_compat.resolve()\n"
        "from maxtext_compat import doctor; doctor.collect()\n"
        "import maxtext_compat.shims, maxtext_compat.adapters"
    )
    assert not [m for m in HEAVY if m in mods]
