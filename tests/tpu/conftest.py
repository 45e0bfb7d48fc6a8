"""The TPU tier (`make test-tpu`, tests marked `tpu`): on a TPU with MAXTEXT_COMPAT_TPU=1, or its dry run on a CPU
with MAXTEXT_COMPAT_TPU=dry (the same tests, the kernel interpreted by the CPU shim, small sizes: proves the
installs, the imports on Python 3.11 and the tests themselves; what only a TPU can show is asserted only there).
Elsewhere tests/conftest.py deselects them."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

MODE = os.environ.get("MAXTEXT_COMPAT_TPU", "")


@dataclass(frozen=True)
class Tier:
    mode: str  # "1" on a TPU, "dry" on a CPU
    tpu: bool  # jax's default backend is a TPU


@pytest.fixture(scope="session")
def tier() -> Tier:
    """Which run this is; refuses a TPU run without a TPU and a dry run with one (nothing passes by mistake)."""
    # Before anything imports tpu_inference (torchax): the machine's torch 2.13 lacks overloads torchax names.
    from helpers.torch_overloads import allow_removed_dimname_overloads

    allow_removed_dimname_overloads()
    import jax

    backend = jax.default_backend()
    if MODE == "1" and backend != "tpu":
        pytest.fail(f"MAXTEXT_COMPAT_TPU=1 but jax's backend is {backend!r}: run on a TPU, or set it to dry")
    if MODE == "dry" and backend != "cpu":
        pytest.fail(f"MAXTEXT_COMPAT_TPU=dry is the CPU rehearsal, but jax's backend is {backend!r}: set it to 1")
    if backend == "cpu":
        from maxtext_compat.shims import cpu_rpa

        status = cpu_rpa.install()
        assert status.active, status.reason
    return Tier(MODE, backend == "tpu")
