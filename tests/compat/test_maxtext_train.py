"""MaxText's own training program, as its users run it, on a release's full pin set: with our shims and without.

The claim "every old call inside MaxText keeps its result, training included" made on MaxText's own program:
train.py (0.1.0: `MaxText.train`; 0.2.5: `maxtext.trainers.pre_train.train`) runs 3 steps of a tiny model on
synthetic data, once as is and once in a process where `maxtext_compat.shims.install()` ran first (0.1.0 gets the
vLLM backport, 0.2.5 the known-defects profile). The per-step losses, gradient and parameter norms MaxText writes to
its metrics file must be equal to the bit, and the shimmed run must really have had patches in it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5-full", "maxtext-0.1.0-full")]

STEPS = 3
# A tiny model, synthetic data, no checkpoint, no distributed system: the overrides both releases accept.
OVERRIDES = [
    "run_name=compat", "dataset_type=synthetic", f"steps={STEPS}", "per_device_batch_size=1", "max_target_length=32",
    "max_prefill_predict_length=16", "base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2",
    "base_mlp_dim=128", "base_num_decoder_layers=2", "head_dim=32", "vocab_size=256", "enable_checkpointing=False",
    "skip_jax_distributed_system=True", "attention=dot_product", "hardware=cpu", "jax_cache_dir=", "log_config=False",
    "enable_tensorboard=False",
]  # fmt: skip
METRICS = ("learning/loss", "learning/grad_norm", "learning/raw_grad_norm", "learning/param_norm")
LAUNCH_WITH_SHIMS = """
import runpy, sys
from maxtext_compat import shims
patched = shims.install()
print("maxtext-compat patches:", len(patched.patches) if patched is not None else 0, flush=True)
module = sys.argv.pop(1)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _program() -> tuple[str, list[str]]:
    """The release's train module and its leading arguments (0.1.0 takes the config path first)."""
    from maxtext_compat.testing import tiny

    if tiny.installed_row().name == "0.1.0":
        import MaxText

        return "MaxText.train", [str(Path(MaxText.__file__).parent / "configs" / "base.yml")]
    return "maxtext.trainers.pre_train.train", []


def _train(tmp: Path, shimmed: bool) -> tuple[list[dict[str, float]], str]:
    module, lead = _program()
    metrics = tmp / "metrics.jsonl"
    args = [*lead, *OVERRIDES, f"base_output_directory={tmp / 'out'}", f"metrics_file={metrics}"]
    cmd = [sys.executable, "-c", LAUNCH_WITH_SHIMS, module, *args] if shimmed else [sys.executable, "-m", module, *args]
    # pyconfig points an empty XLA_FLAGS at an HLO dump in /tmp: give it a harmless value instead
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows, log


def test_train_runs_and_the_shims_leave_every_step_equal(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "shimmed").mkdir()
    plain, _ = _train(tmp_path / "plain", shimmed=False)
    shimmed, log = _train(tmp_path / "shimmed", shimmed=True)
    patches = int(log.split("maxtext-compat patches:", 1)[1].split()[0])
    assert patches > 0, "the shimmed run had no patch installed: it proves nothing"
    assert [r["step"] for r in plain] == list(range(STEPS)), plain
    losses = [r["learning/loss"] for r in plain]
    assert all(math.isfinite(x) and 0 < x < 2 * math.log(256) for x in losses), losses  # near log(vocab) untrained
    for name in METRICS:
        if name in plain[0]:
            assert [r[name] for r in shimmed] == [r[name] for r in plain], name  # equal to the bit
    print(f"\n[train] {_program()[0]}: {patches} patches; losses {losses}, equal with and without the shims")
