"""Which run of the accelerator tier this is (tests/tpu, make test-accel, make bench-accel): one reading for the
tests, their conftests and benchmarks/bench_tpu.py.

MAXTEXT_COMPAT_ACCEL (MAXTEXT_COMPAT_TPU is its older name, read when it is unset):
- `1`: on an accelerator, the platform jax finds: a TPU runs everything; a GPU runs all but the tests marked
  `pallas` (the Pallas TPU kernel, vllm-tpu), deselected with that reason, with tpu-inference's kernel bound to
  rpa_xla (the XLA kernel) for MaxText's vLLM attention;
- `dry`: the TPU route rehearsed on a CPU (the Pallas kernel interpreted by the CPU shim);
- `dry-gpu`: the GPU route rehearsed on a CPU (no Pallas: `pallas` tests deselected, rpa_xla bound).
"""

from __future__ import annotations

import os

ENV = "MAXTEXT_COMPAT_ACCEL"
OLD_ENV = "MAXTEXT_COMPAT_TPU"
MODES = ("1", "dry", "dry-gpu")
PALLAS_REASON = "needs the Pallas TPU kernel or vllm-tpu, which run on a TPU only"


def mode() -> str:
    """The mode set ('' when the tier is not asked for); any other value is refused, naming the variable (a typo
    such as `tpu` would otherwise run the tier as an accelerator run, or not at all)."""
    raw = os.environ.get(ENV) or os.environ.get(OLD_ENV, "")
    if raw not in ("", *MODES):
        name = ENV if os.environ.get(ENV) else OLD_ENV
        raise ValueError(f"{name}={raw!r} names no mode of the accelerator tier: expected one of {list(MODES)}")
    return raw


def dry() -> bool:
    return mode() in ("dry", "dry-gpu")


def without_pallas(backend: str) -> bool:
    """Whether this run takes the GPU route: a GPU found, or its CPU rehearsal."""
    return backend == "gpu" or mode() == "dry-gpu"
