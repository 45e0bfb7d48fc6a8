"""The TPU tier's tests of one stage, then (with --bench) benchmarks/bench_tpu.py's section, in one process.

Why one process: one program at a time may hold the chip and opening it costs ~15 s, and the imports (torch, vLLM,
tpu-inference, MaxText) as much again; a device call pays them once (tools/tpu/call.sh). Run by tools/tpu/run.sh
(make test-tpu) and call.sh with tools/tpu/env.sh's settings; pytest writes junit and its log where run.sh says.

usage: session.py STAGE [--bench SECTION --json PATH] [-- pytest args ...]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = {  # in the order a stage runs them: what is worth most first
    "core": ("test_tier_kernel.py", "test_tier_layers.py", "test_tier_maxtext.py"),
    "model": ("test_tier_smollm2.py", "test_tier_vllm.py"),
    "gemma": ("test_tier_gemma3.py",),
    "seed": ("test_tier_seed_sizes.py",),  # after tests/tpu/seed_size_run.py, one process per model (call.sh seed)
}
STAGES["all"] = STAGES["core"] + STAGES["model"] + STAGES["gemma"]


def main(argv: list[str]) -> int:
    own, _, extra = (argv[: argv.index("--")], None, argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=sorted(STAGES))
    ap.add_argument("--junit", type=Path, required=True)
    ap.add_argument("--bench", help="bench_tpu.py's sections: kernel, step, model, all, or several as kernel,step")
    ap.add_argument("--json", type=Path, help="where --bench writes its figures")
    a = ap.parse_args(own)
    import pytest

    start = time.perf_counter()
    files = [str(ROOT / "tests" / "tpu" / f) for f in STAGES[a.stage]]
    rc = int(pytest.main([*files, "-m", "tpu", "-p", "no:cacheprovider", "-rA", f"--junitxml={a.junit}", *extra]))
    print(f"[session] stage {a.stage}: pytest exit {rc} in {time.perf_counter() - start:.0f} s", flush=True)
    if a.bench is None:
        return rc
    _reopen_closed_log_streams()
    _native_again()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_tpu

    start = time.perf_counter()
    try:
        bench_rc = bench_tpu.main([a.bench, "--json", str(a.json)])
    except BaseException as exc:  # the tests' results stand; the figures say why they are missing
        print(f"[session] bench {a.bench} failed: {type(exc).__name__}: {exc}", flush=True)
        bench_rc = 1
    print(f"[session] bench {a.bench}: exit {bench_rc} in {time.perf_counter() - start:.0f} s", flush=True)
    return rc or bench_rc


def _native_again() -> None:
    """The bench measures MaxText native beside our layer: what the tests left installed (shim profiles, a declared
    caller convention) is removed first, and said (on the v5e the model stage's tests left `known-defects`
    installed)."""
    from maxtext_compat import shims
    from maxtext_compat.convention import callers

    left = shims.active_profiles()
    if left:
        print(f"[session] the tests left shim profiles installed: {left}; uninstalled before the bench", flush=True)
        shims.uninstall()
    callers.set_caller_convention(None)
    assert not shims.active_profiles(), shims.active_profiles()


def _reopen_closed_log_streams() -> None:
    """Loggers configured while pytest captured output (vLLM's) still write to its closed buffers: point them at
    stderr, so the bench's warnings are printed instead of a "Logging error" traceback each (seen on the v5e)."""
    import logging

    named = logging.Logger.manager.loggerDict.values()
    loggers = [logging.getLogger(), *(v for v in named if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and getattr(stream, "closed", False):
                with handler.lock or contextlib.nullcontext():  # not setStream: it flushes the closed stream first
                    handler.stream = sys.stderr


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
