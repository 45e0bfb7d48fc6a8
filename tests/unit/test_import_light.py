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
    # The list is taken before json is imported: json brings re and functools, which the light import must not.
    script = code + "\nimport sys\n_mods = sorted(sys.modules)\nimport json\nprint(json.dumps(_mods))"
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


def test_import_leaves_the_contract_and_typing_machinery_to_first_use():
    """Issue 39: the contract package (with typing, inspect and re) cost `import maxtext_compat` ~20 ms; the
    public functions load it at their first call. Measured against a bare interpreter of the same environment
    (a site hook may import some of these itself)."""
    bare = _modules_after("pass")
    mods = _modules_after("import maxtext_compat")
    assert not [m for m in mods if m.startswith("maxtext_compat.contract")]
    assert not ({"typing", "inspect", "re", "dataclasses", "pathlib"} & (mods - bare))


def test_the_first_call_loads_the_contract_and_checks():
    """Deferred, still checked: the first call of resolve refuses a wrong type with our typed error."""
    mods = _modules_after(
        "import maxtext_compat\n"
        "try:\n    maxtext_compat.resolve(5)\n"
        "except maxtext_compat.InvalidArgumentTypeError as err:\n    assert err.argument == 'versions', err\n"
        "else:\n    raise SystemExit('resolve(5) was not refused')\n"
        "from maxtext_compat.contract import contract_of\n"
        "assert contract_of(maxtext_compat.load_matrix).where == 'load_matrix'"
    )
    assert "maxtext_compat.contract.check" in mods
