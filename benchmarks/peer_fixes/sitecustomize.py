"""Loaded by every process of the Gemma 3 peer's `vllm serve` (benchmarks/bench_serving.py puts this folder first
on its PYTHONPATH): tpu-inference's open PR #3595 ("Fix float32 inference on the vLLM model path"), nothing else.

Why: tpu-inference 0.32.0 serves Gemma 3 through its vLLM model path (torchax), whose weight loader hands each
float32 parameter to numpy (`torchax.ops.mappings.t2j`: a bfloat16 one is copied to float32 first, a float32 one is
not), which marks the parameter's storage non-resizable, and then frees it with `untyped_storage().resize_(0)`:
`RuntimeError: Trying to resize storage that is not resizable` on the first linear layer, on a TPU as on a CPU.
The fix hands numpy a copy, as bfloat16 already gets; the peer then serves the same float32 weights as ours.
tests/compat/test_bench_peer_fix.py holds both the defect and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import wrapt

MODULE = "tpu_inference.layers.vllm.quantization.unquantized"


def copying_t2j(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (torchax's t2j) given a copy of a tensor numpy would otherwise alias (float32, float16)."""
    import torch

    aliasing = (torch.float32, torch.float16)

    def t2j(tensor: Any, use_dlpack: bool = True) -> Any:
        return original(tensor.detach().clone() if tensor.dtype in aliasing else tensor, use_dlpack=use_dlpack)

    return t2j


@wrapt.when_imported(MODULE)
def _apply(module: Any) -> None:
    module.t2j = copying_t2j(module.t2j)
