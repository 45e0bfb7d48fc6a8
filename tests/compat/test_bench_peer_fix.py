"""The one upstream fix `make bench` gives its Gemma 3 peer (benchmarks/peer_fixes/sitecustomize.py): the defect it
works around is still in the installed tpu-inference (a float32 parameter handed to torchax's t2j can no longer be
freed, and the loader frees it), and the fix keeps the storage resizable with the same values. When a release fixes
it (tpu-inference PR #3595), the first test fails: the bench's peer then needs no fix."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

pytestmark = pytest.mark.envs("maxtext-0.2.5")  # the bench's environment (tpu-inference 0.32.0)
FIX = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_fixes" / "sitecustomize.py"


def _fix():
    spec = importlib.util.spec_from_file_location("peer_fix_sitecustomize", FIX)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the hook for MODULE; the test calls copying_t2j itself
    return module


def test_the_installed_loader_frees_what_torchax_t2j_left_unresizable():
    import torch
    from torchax.ops import mappings
    from tpu_inference.layers.vllm.quantization import unquantized

    loader = inspect.getsource(unquantized.VllmUnquantizedLinearMethod._load_linear_weights)
    assert "untyped_storage().resize_(0)" in loader and unquantized.t2j is mappings.t2j
    weight = torch.nn.Parameter(torch.ones(4, 8), requires_grad=False)
    mappings.t2j(weight, use_dlpack=False)
    assert not weight.untyped_storage().resizable()
    with pytest.raises(RuntimeError, match="not resizable"):
        weight.untyped_storage().resize_(0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_fix_leaves_the_storage_resizable_and_the_values_equal(dtype):
    import numpy as np
    import torch
    from torchax.ops import mappings

    fixed = _fix().copying_t2j(mappings.t2j)
    weight = torch.nn.Parameter(torch.arange(32, dtype=getattr(torch, dtype)).reshape(4, 8), requires_grad=False)
    array = fixed(weight, use_dlpack=False)
    np.testing.assert_array_equal(np.asarray(array, dtype=np.float32), np.arange(32, dtype=np.float32).reshape(4, 8))
    weight.untyped_storage().resize_(0)  # what the loader does next
    assert weight.untyped_storage().nbytes() == 0
