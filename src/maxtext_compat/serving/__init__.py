"""Serving MaxText with vLLM (vllm-tpu + tpu-inference): model class, backends, config, weights.

Light on import: `model.py` (flax) and the backends (MaxText, jax) load on first use. The vLLM
plugin (`maxtext_compat.serve.vllm_plugin:register`) wires them up in every vLLM process.
"""

from __future__ import annotations

from maxtext_compat.serving.backend import (
    ServingBackend,
    StepOutput,
    backend_for,
    register_backend,
    registered_backends,
)

__all__ = [
    "ServingBackend",
    "StepOutput",
    "backend_for",
    "register_backend",
    "registered_backends",
]
