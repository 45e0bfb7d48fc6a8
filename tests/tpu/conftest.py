"""The TPU tier (`make test-tpu`, tests marked `tpu`): on a TPU with MAXTEXT_COMPAT_TPU=1, or its dry run on a CPU
with MAXTEXT_COMPAT_TPU=dry (the same tests, the kernel interpreted by the CPU shim, small sizes: proves the
installs, the imports on Python 3.11 and the tests themselves; what only a TPU can show is asserted only there).
Elsewhere tests/conftest.py deselects them."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MODE = os.environ.get("MAXTEXT_COMPAT_TPU", "")
# Where results go as they come (tools/tpu/run.sh points it into the device call's $OUT): progress.jsonl gets one
# line per finished test, so a call stopped at its time limit still says how far it got; record() fills records.json
# (one file: a call brings back at most 8).
RESULTS = Path(os.environ.get("TPU_RESULTS", "build/tpu/results"))
# transformers' reading of the GGUF file, kept between calls on a warm machine (testing.real_model.hf_reference)
HF_CACHE = Path(os.environ.get("TPU_HF_CACHE", "build/tpu/hf-reference"))


@dataclass(frozen=True)
class Tier:
    mode: str  # "1" on a TPU, "dry" on a CPU
    tpu: bool  # jax's default backend is a TPU
    cache: Path = HF_CACHE

    def record(self, name: str, data: Any) -> Path:
        """Put `data` under `name` in RESULTS/records.json (rewritten whole: it is there if the call stops)."""
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / "records.json"
        records = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        records[name] = data
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(records, indent=1, default=str), encoding="utf-8")
        partial.replace(path)
        return path


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed" or report.duration > 1.0:  # a fixture's set-up too
        RESULTS.mkdir(parents=True, exist_ok=True)
        line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
                "seconds": round(report.duration, 2), "at": time.strftime("%H:%M:%S")}  # fmt: skip
        if report.outcome == "failed":
            line["error"] = str(report.longrepr)[-2000:]
        with (RESULTS / "progress.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


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
    found = Tier(MODE, backend == "tpu")
    found.record("environment", _environment())
    return found


def _environment() -> dict[str, Any]:
    """What the tier ran on: the device, the Python, the versions that matter."""
    import importlib.metadata
    import platform

    import jax

    versions = {}
    for dist in ("jax", "jaxlib", "libtpu", "flax", "maxtext", "tpu-inference", "vllm-tpu", "torch", "transformers"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    device = jax.devices()[0]
    return {"mode": MODE, "backend": jax.default_backend(), "device_kind": device.device_kind,
            "devices": len(jax.devices()), "python": platform.python_version(), "versions": versions}  # fmt: skip
