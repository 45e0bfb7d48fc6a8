"""The seed's model sizes served by `vllm.LLM` with the plugin on the chip: MaxText's own `qwen3-4b`, `gemma3-4b` and
`llama3.1-8b` configs at full depth and width, random weights made on the chip, bfloat16.

Each model runs in a process of its own before this test (tests/tpu/seed_size_run.py, `tools/tpu/call.sh seed`: one
program at a time holds the chip, and a model that does not fit must not take a test process with it); this test
judges the records they wrote. A model that fits must serve: each prompt's 32 greedy ids, the same again, figures
recorded. One that does not fit must fail with the chip's out-of-memory, and the record says by how much (16.06 GB of
llama3.1-8b's bfloat16 weights on a 15.75 GiB chip); any other failure fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tpu, pytest.mark.pallas]

MODELS = ("qwen3-4b", "gemma3-4b", "llama3.1-8b")
FIT = ("qwen3-4b", "gemma3-4b")  # bfloat16 weights well under the chip's memory
OOM_WORDS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "OOM", "exceeds the available")
RECORDS = Path(os.environ.get("TPU_SEED_RECORDS", "build/tpu/seed"))


@pytest.mark.parametrize("name", MODELS)
def test_the_seeds_size_is_served_or_refused_by_the_chips_memory(tier, name):
    if not tier.accelerator:
        pytest.skip("the seed's sizes need the chip (tools/tpu/call.sh seed)")
    path = RECORDS / f"seed-{name}.json"
    assert path.is_file(), f"{path}: tools/tpu/call.sh seed runs tests/tpu/seed_size_run.py {name} first"
    record = json.loads(path.read_text())
    tier.record(f"seed-{name}", {k: v for k, v in record.items() if k != "ids"})
    if record["status"] == "served":
        assert record["b1_repeatable"] and record["alone_b1_again"], record
        assert all(len(ids) == record["new_tokens"] for ids in record["ids"]), record["ids"]
        assert set(record["end_to_end"]) == {"1", "8"} and record["replaced"]["init"] >= 1, record
        return
    assert name not in FIT, f"{name} should fit: {record.get('error')}\n{record.get('traceback')}"
    assert any(w in record["error"] + record.get("traceback", "") for w in OOM_WORDS), record
    assert record["weights_gib_bf16"] > 0.9 * record.get("hbm_at_failure_gib", {}).get("bytes_limit", 15.75), record
