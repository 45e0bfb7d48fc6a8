"""One of the seed's model sizes served by `vllm.LLM` through the plugin on the chip, random weights (no download),
bfloat16; run in a process of its own by test_tier_seed_sizes.py (one program holds the chip, and a model that does
not fit must not take the test's process with it). Writes one JSON record: what fit, the figures, the ids.

usage: seed_size_run.py MODEL_NAME OUT_JSON
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

MAX_LEN = 128
NEW_TOKENS = 32
BATCHES = (1, 8)
SIZE_KEYS = (
    "base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "head_dim", "base_mlp_dim",
    "base_num_decoder_layers", "vocab_size", "logits_via_embedding", "normalization_layer_epsilon",
)  # fmt: skip


def model_sizes(name: str) -> dict[str, Any]:
    """The installed MaxText's own config of `name` (configs/models/NAME.yml): the sizes vLLM's config.json needs."""
    import maxtext
    import yaml

    found = list(Path(maxtext.__file__).parent.rglob(f"configs/models/{name}.yml"))
    if not found:
        raise FileNotFoundError(f"MaxText {maxtext.__file__} has no configs/models/{name}.yml")
    raw = yaml.safe_load(found[0].read_text())
    return {k: raw[k] for k in SIZE_KEYS if k in raw}


def hbm() -> dict[str, float]:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    gib = 2**30
    return {k: round(stats[k] / gib, 2) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}


def prompts(vocab: int, n: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(10, vocab - 10, size=int(rng.integers(8, 24))).tolist() for _ in range(n)]


def main(name: str, out: Path) -> int:
    from helpers import torchvision_placeholder
    from helpers.socketless_launch import LAUNCH, socketless_launch
    from maxtext_compat.serving.model_dir import write_model_dir

    record: dict[str, Any] = {"model": name, "launch": LAUNCH, "max_model_len": MAX_LEN, "new_tokens": NEW_TOKENS}
    try:
        sizes = model_sizes(name)
        record["sizes"] = sizes
        params = _parameters(sizes)
        record["parameters_b"] = round(params / 1e9, 3)
        record["weights_gib_bf16"] = round(params * 2 / 2**30, 2)
        mdir = write_model_dir(f"/tmp/seed-{name}", {**sizes, "max_target_length": MAX_LEN, "dtype": "bfloat16"})
        maxtext = {"model_name": name, "max_target_length": MAX_LEN, "max_prefill_predict_length": MAX_LEN - NEW_TOKENS,
                   "dtype": "bfloat16", "weight_dtype": "bfloat16"}  # fmt: skip
        torchvision_placeholder.install()
        import os

        os.environ.update(NEW_MODEL_DESIGN="1", SKIP_JAX_PRECOMPILE="1", HF_HUB_OFFLINE="1")
        from vllm import LLM, SamplingParams

        greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        with socketless_launch() as replaced:
            t0 = time.perf_counter()
            llm = LLM(model=mdir, additional_config={"maxtext_config": maxtext}, load_format="dummy",
                      skip_tokenizer_init=True, max_model_len=MAX_LEN, max_num_seqs=max(BATCHES),
                      max_num_batched_tokens=512, dtype="bfloat16", tensor_parallel_size=1)  # fmt: skip
            record["engine_start_s"] = round(time.perf_counter() - t0, 1)
            record["hbm_after_start_gib"] = hbm()
            ps = prompts(int(sizes["vocab_size"]), max(BATCHES))

            def run(batch: list[list[int]]) -> tuple[list[list[int]], float]:
                t = time.perf_counter()
                answers = llm.generate([{"prompt_token_ids": p} for p in batch], greedy, use_tqdm=False)
                return [list(a.outputs[0].token_ids) for a in answers], time.perf_counter() - t

            first, record["first_request_s"] = run(ps[:1])  # compiles its buckets
            again, record["ttft_and_decode_b1_s"] = run(ps[:1])
            record["b1_repeatable"] = first == again
            figures = {}
            alone: list[list[int]] = []
            for b in BATCHES:
                run(ps[:b])  # compile the batch's buckets
                ids, wall = run(ps[:b])
                figures[b] = {"tokens_per_s": round(b * NEW_TOKENS / wall, 1), "wall_s": round(wall, 3)}
                if b == 1:
                    alone = ids
            record["end_to_end"] = figures
            each = [run([p])[0][0] for p in ps]
            together, _ = run(ps)
            record["batch_equals_alone"] = together == each
            record["differing_prompts"] = [i for i, (a, b) in enumerate(zip(together, each, strict=True)) if a != b]
            record["ids"] = each
            record["alone_b1_again"] = alone == each[:1]
            record["hbm_peak_gib"] = hbm()
            record["replaced"] = dict(replaced)
        record["status"] = "served"
    except BaseException as exc:  # recorded: what did not fit or failed, with where
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        record["traceback"] = traceback.format_exc()[-4000:]
        with contextlib.suppress(Exception):  # the chip itself may be what failed
            record["hbm_at_failure_gib"] = hbm()
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k not in ("ids", "traceback")}), flush=True)
    return 0


def _parameters(s: dict[str, Any]) -> int:
    """Weights of a dense decoder with a gated MLP: embeddings (+ an untied head) and per layer q/k/v/o and MLP."""
    d, h, kv, hd, mlp, n, v = (int(s[k]) for k in SIZE_KEYS[:7])
    layer = d * hd * (h + 2 * kv) + h * hd * d + 3 * d * mlp
    return v * d * (1 if s.get("logits_via_embedding", False) else 2) + n * layer


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
