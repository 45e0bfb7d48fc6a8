"""MaxText's own training program, run as its users run it: a tiny model, synthetic data, a few steps.

Why one place: the training test (with and without our shims) and the train -> checkpoint -> serve test start the
same program of the installed release (0.1.0: `MaxText.train` with its base.yml first; 0.2.5:
`maxtext.trainers.pre_train.train`) with the same tiny model, and must not drift apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A tiny model, synthetic data, no distributed system: the overrides both releases accept.
MODEL = {
    "base_emb_dim": 64, "base_num_query_heads": 2, "base_num_kv_heads": 2, "base_mlp_dim": 128,
    "base_num_decoder_layers": 2, "head_dim": 32, "vocab_size": 256,
}  # fmt: skip
RUN = {
    "run_name": "compat", "dataset_type": "synthetic", "per_device_batch_size": 1, "max_target_length": 32,
    "max_prefill_predict_length": 16, "enable_checkpointing": False, "skip_jax_distributed_system": True,
    "attention": "dot_product", "hardware": "cpu", "jax_cache_dir": "", "log_config": False,
    "enable_tensorboard": False,
}  # fmt: skip
STEPS = 3
# The session's run (tests/compat/conftest.py `maxtext_trained`): float32 activations (the served ids are compared
# with MaxText's decode in float32) and the last step's checkpoint saved before the trainer exits.
CHECKPOINTED = {"dtype": "float32", "enable_checkpointing": True, "async_checkpointing": False,
                "checkpoint_period": STEPS - 1}  # fmt: skip
LAUNCH_WITH_SHIMS = """
import runpy, sys
from maxtext_compat import shims
patched = shims.install()
print("maxtext-compat patches:", len(patched.patches) if patched is not None else 0, flush=True)
module = sys.argv.pop(1)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def program() -> tuple[str, list[str]]:
    """The release's train module and its leading arguments (0.1.0 takes the config path first)."""
    from maxtext_compat.testing import tiny

    if tiny.installed_row().name == "0.1.0":
        import MaxText

        return "MaxText.train", [str(Path(MaxText.__file__).parent / "configs" / "base.yml")]
    return "maxtext.trainers.pre_train.train", []


def argument(key: str, value: Any) -> str:
    """KEY=VALUE as MaxText's command line reads it."""
    text = str(value).lower() if isinstance(value, bool) else "" if value is None else str(value)
    return f"{key}={text}"


def train(workdir: Path, overrides: Mapping[str, Any], *, steps: int, shimmed: bool = False) -> tuple[list[dict], str]:
    """Run the trainer in `workdir` (its output in workdir/out); (the per-step metrics rows, the log)."""
    module, lead = program()
    metrics = workdir / "metrics.jsonl"
    values = {**RUN, **MODEL, **overrides, "steps": steps, "base_output_directory": workdir / "out",
              "metrics_file": metrics}  # fmt: skip
    args = [*lead, *(argument(k, v) for k, v in values.items())]
    cmd = [sys.executable, "-c", LAUNCH_WITH_SHIMS, module, *args] if shimmed else [sys.executable, "-m", module, *args]
    # pyconfig points an empty XLA_FLAGS at an HLO dump in /tmp: give it a harmless value instead
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=900, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows, log
