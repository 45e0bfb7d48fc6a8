"""Import cost: `import maxtext_compat` in fresh processes, and proof that it imports nothing heavy.

    MAXTEXT_COMPAT_ENV=maxtext-0.2.5 .envs/maxtext-0.2.5/bin/python benchmarks/bench_import.py

Why: vLLM imports the plugin entry point in every process it starts and the doctor runs on
machines without a working jax, so the package must stay cheap to import and must not pull jax,
MaxText, tpu-inference, vLLM or torch in. Run where all of those are installed (the 0.2.5
environment), so a stray import would show. Reference ("native"): importing MaxText's own
Transformer module, timed once in this process, which must not have imported anything heavy yet
(run_all runs this script first in its process).
"""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import run_all

ROUNDS = 10
HEAVY = ("jax", "jaxlib", "flax", "maxtext", "MaxText", "tpu_inference", "vllm", "torch", "tensorflow", "numpy")
LIGHT_API = "import maxtext_compat, maxtext_compat.adapters, maxtext_compat.shims, maxtext_compat.serve.vllm_plugin"


def _seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def _modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return set(json.loads(out.strip().splitlines()[-1]))


def run() -> list[dict[str, Any]]:
    run_all.cpu_env()
    already = sorted(m for m in HEAVY if m in sys.modules)
    rows: list[dict[str, Any]] = []

    # Fresh processes, interleaved: extra = (import maxtext_compat) - (pass), paired per round.
    _seconds("pass")
    extra = []
    for _ in range(ROUNDS):
        base = _seconds("pass")
        extra.append(_seconds("import maxtext_compat") - base)
    q = statistics.quantiles(extra, n=4)
    ours = statistics.median(extra) * 1e3

    # The reference: MaxText's Transformer module, imported here for the first time.
    from maxtext_compat.testing.tiny import installed_row

    ref = installed_row().classes["transformer"]
    native = None
    if not already and ref is not None:
        start = time.perf_counter()
        importlib.import_module(ref.module)
        native = (time.perf_counter() - start) * 1e3
    how = (f"median over {ROUNDS} fresh `python -c` processes of (import maxtext_compat) - (pass), paired; native: "
           f"first `import {ref.module if ref else '?'}` in a process with no jax yet")  # fmt: skip
    if already:
        how += f" (not measured: {already} were already imported)"
    rows.append(run_all.row("import cost · import maxtext_compat", ours, "ms", how, native=native,
                            spread=f"IQR {q[0] * 1e3:.1f} to {q[2] * 1e3:.1f}"))  # fmt: skip

    mods = _modules(LIGHT_API)
    heavy = sorted({m.split(".")[0] for m in mods} & set(HEAVY))
    added = len(mods - _modules("pass"))
    native_heavy = len({m.split(".")[0] for m in sys.modules} & set(HEAVY)) if native is not None else None
    how = (
        f"`{LIGHT_API}` in a fresh process imports {added} modules; heavy ones among them: "
        f"{heavy or 'none'} (checked: {', '.join(HEAVY)}); native: heavy packages loaded by MaxText's import"
    )
    rows.append(run_all.row("import cost · heavy packages imported", len(heavy), "packages", how, native=native_heavy))
    print(f"  import maxtext_compat: +{ours:.1f} ms (MaxText: {native} ms); heavy: {heavy}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    run_all.emit(run())
