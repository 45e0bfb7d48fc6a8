"""The accelerator tier (`make test-accel`, tests marked `tpu`): on a TPU or GPU with MAXTEXT_COMPAT_ACCEL=1, or its
CPU rehearsals: `dry` (the TPU route: the same tests, the kernel interpreted by the CPU shim, small sizes: proves the
installs, the imports on Python 3.11 and the tests themselves; what only a TPU can show is asserted only there) and
`dry-gpu` (the GPU route: no Pallas). On the GPU route the tests marked `pallas` are deselected with their reason
(never counted as passed) and tpu-inference's kernel globals are bound to rpa_xla for MaxText's vLLM attention
(tests/helpers/accel_mode.py). Elsewhere tests/conftest.py deselects the tier."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import accel_mode

MODE = accel_mode.mode()
# Where results go as they come (tools/tpu/run.sh points it into the device call's $OUT): progress.jsonl gets one
# line per finished test, so a call stopped at its time limit still says how far it got; record() fills records.json
# (one file: a call brings back at most 8).
RESULTS = Path(os.environ.get("TPU_RESULTS", "build/tpu/results"))
# transformers' reading of the GGUF file, kept between calls on a warm machine (testing.real_model.hf_reference)
HF_CACHE = Path(os.environ.get("TPU_HF_CACHE", "build/tpu/hf-reference"))


@dataclass(frozen=True)
class Tier:
    mode: str  # "1" on an accelerator, "dry" / "dry-gpu" on a CPU
    tpu: bool  # jax's default backend is a TPU
    platform: str = "cpu"  # jax's default backend
    cache: Path = HF_CACHE

    @property
    def accelerator(self) -> bool:
        """A TPU or GPU (full sizes), not a CPU rehearsal."""
        return self.platform in ("tpu", "gpu")

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


def _backend() -> str:
    # Before anything imports tpu_inference (torchax): the machine's torch 2.13 lacks overloads torchax names.
    from helpers.torch_overloads import allow_removed_dimname_overloads

    allow_removed_dimname_overloads()
    import jax

    return jax.default_backend()


_DESELECTED: list[str] = []  # the GPU route's deselected tests, reported at the end and in records.json


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the GPU route, deselect the tests marked `pallas` (reported with their reason, recorded, never passed)."""
    if MODE not in accel_mode.MODES or not accel_mode.without_pallas(_backend()):
        return
    kept = [i for i in items if i.get_closest_marker("pallas") is None]
    dropped = [i for i in items if i.get_closest_marker("pallas") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        _DESELECTED.extend(i.nodeid for i in dropped)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _DESELECTED:
        terminalreporter.write_line(f"[tier] {len(_DESELECTED)} deselected: {accel_mode.PALLAS_REASON}")
        for nodeid in _DESELECTED:
            terminalreporter.write_line(f"[tier]   {nodeid}")


@pytest.fixture(scope="session")
def tier() -> Iterator[Tier]:
    """Which run this is; refuses an accelerator run without one and a dry run with one (nothing passes by
    mistake). The TPU route on a CPU interprets the kernel; the GPU route binds rpa_xla where the kernel was."""
    backend = _backend()
    if MODE == "1" and backend not in ("tpu", "gpu"):
        pytest.fail(f"{accel_mode.ENV}=1 but jax's backend is {backend!r}: run on a TPU or GPU, or set it to dry")
    if MODE in ("dry", "dry-gpu") and backend != "cpu":
        pytest.fail(f"{accel_mode.ENV}={MODE} is a CPU rehearsal, but jax's backend is {backend!r}: set it to 1")
    with contextlib.ExitStack() as stack:
        if accel_mode.without_pallas(backend):
            from helpers.xla_kernel import rpa_xla_bound

            stack.enter_context(rpa_xla_bound())
        elif backend == "cpu":
            from maxtext_compat.cpu import rpa as cpu_rpa

            status = cpu_rpa.install()
            assert status.active, status.reason
        found = Tier(MODE, backend == "tpu", backend)
        found.record("environment", {**_environment(), "deselected": {"reason": accel_mode.PALLAS_REASON,
                                                                      "tests": _DESELECTED}})  # fmt: skip
        yield found


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
