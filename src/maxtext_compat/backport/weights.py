"""Scanned checkpoints for the backport: the vLLM path of MaxText 0.1.0 needs an unscanned decoder.

Why: tpu-inference's kernel runs through the Pallas interpreter on CPU, whose effects flax
0.12's `nn.scan` refuses ("broadcasted variable has a data dependency on the scan body"), and
MaxText's own configs/inference/vllm.yml sets scan_layers=False too. Build the model with
scan_layers=False and load `unscan_params(scanned_params, config)` into it. The code lives in
maxtext_compat.weights; this module is where the backport's error message points.
"""

from __future__ import annotations

from maxtext_compat.weights import load_params, unscan_params

__all__ = ["load_params", "unscan_params"]
