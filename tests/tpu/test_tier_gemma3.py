"""Gemma 3 270M (Q4_K_M, assembled from its PyPI chunk packages, converted by maxtext_compat.convert) greedy-decoded
by MaxText 0.2.3 on the chip through the paged KV cache and the RPA kernel (MaxText's vLLM path, its local layers
passing the file's 512-token sliding window to the kernel), and by MaxText's own dense decode beside it, float32 at
`highest` matmul precision, against transformers reading the same file on the machine's CPU: the seed's four prompts
and a ~590-token prompt past the window (the dry run: one prompt and 4 tokens, the kernel interpreted). Each path's
ids equal the reference's or a difference the margin rule explains (tests/helpers/token_margin.py). Then the window
on the chip: the long prompt's prefill logits within LOGITS_TOLERANCE of transformers', and the same model with the
window switched off (a window as long as the cache) farther than WINDOW_EFFECT from them, so the kernel really cut.
The verdicts, logit errors and seconds go to the results folder (gemma3-*).

The TPU machine's transformers (5.17.0, its own index) reads the file's tokenizer otherwise than 5.19.0 and our
tokenizer do ("Seattle": three pieces instead of one; 5.19.0 and ours agree, tests/compat/test_real_gemma3.py), so
where the ids differ the reference is transformers' model decoding our ids, and the difference is recorded
(gemma3-tokenizer): what this stage compares is the model on the chip, not the tokenizer."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from helpers.token_margin import Verdict, chosen_rows, judge

pytestmark = pytest.mark.tpu

PAGE = 16
LOGITS_TOLERANCE = 0.25  # as tests/compat/test_real_gemma3.py: MaxText's bfloat16 copy of the tied 262k table
WINDOW_EFFECT = 0.5


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


def _paged(ckpt: Any, prompts: list[list[int]], new: int, **overrides: Any) -> Any:
    """A paged generation of `prompts` (new tokens each) on the installed MaxText's vLLM path; the model is dropped."""
    from maxtext_compat.decode import Buckets, PagedEngine
    from maxtext_compat.testing import real_gemma3 as g3

    longest = max(len(p) for p in prompts) + new
    pages_per_seq = _padded(longest) // PAGE + 1
    model = g3.paged_model(ckpt, max_len=pages_per_seq * PAGE, **overrides)
    buckets = Buckets(max_num_tokens=_padded(sum(len(p) for p in prompts)), max_num_seqs=len(prompts),
                      pages_per_seq=pages_per_seq)  # fmt: skip
    engine = PagedEngine(model, num_pages=pages_per_seq * len(prompts) + 1, page_size=PAGE, buckets=buckets)
    gen = engine.generate(prompts, new - 1)
    gen.tokens()
    return gen


@pytest.fixture(scope="module")
def run(tier) -> dict[str, Any]:
    """The reference (transformers: ids, per-step logits) and both MaxText paths on the same prompts."""
    import jax

    from maxtext_compat.convert import read_source
    from maxtext_compat.testing import real_gemma3 as g3
    from maxtext_compat.testing import real_model as rm

    start = time.perf_counter()
    path = g3.gemma3_gguf(tier.cache.parent / "gemma3")
    ckpt, tokenizer, _ = read_source(path)
    ref = g3.reference(path, tier.cache)  # transformers on the host's CPU; kept on a warm machine
    read_seconds = time.perf_counter() - start
    prompts = list(g3.ALL_PROMPTS) if tier.accelerator else list(g3.PROMPTS[:1])
    new = g3.NEW_TOKENS if tier.accelerator else 4
    ids = [tokenizer.encode(p).ids for p in prompts]
    assert not tier.accelerator or len(ids[-1]) > ckpt.shape.sliding_window + 16  # the long prompt passes the window
    if ref.prompt_ids[: len(ids)] == ids:
        reference = [g[:new] for g in ref.greedy[: len(ids)]]
    else:  # the machine's transformers tokenizes the file otherwise: its model decodes our ids (see the docstring)
        # the version is in the "environment" record
        tier.record("gemma3-tokenizer", {"ours": ids, "transformers_ids": ref.prompt_ids[: len(ids)]})
        reference = rm.hf_greedy(ref.model, ids, new)
    ref_logits = [chosen_rows(rm.hf_logits(ref.model, p + r), len(p), new) for p, r in zip(ids, reference, strict=True)]
    seconds: dict[str, float] = {"read_file_and_reference": read_seconds}
    with jax.default_matmul_precision("highest"):
        t = time.perf_counter()
        gen = _paged(ckpt, ids, new)
        seconds["paged_build_compile_decode"] = time.perf_counter() - t
        paged = gen.tokens()
        paged_logits = [[np.asarray(step.logits[i][-1]) for step in gen.steps] for i in range(len(ids))]
        t = time.perf_counter()
        cfg, mesh, model = rm.maxtext_model(ckpt, max_len=_padded(max(len(p) for p in ids) + new))
        dense = rm.maxtext_greedy(cfg, mesh, model, ids, new)
        whole = rm.maxtext_logits(cfg, mesh, model, [p + d for p, d in zip(ids, dense, strict=True)])
        seconds["dense_build_compile_decode"] = time.perf_counter() - t
        del model
    dense_logits = [chosen_rows(whole[i], len(p), new) for i, p in enumerate(ids)]
    return {
        "ckpt": ckpt,
        "ids": ids,
        "hf": ref.model,
        "prompts": prompts,
        "tokenizer": tokenizer,
        "reference": reference,
        "paged": paged,
        "dense": dense,
        "first_logits": [np.asarray(gen.steps[0].logits[i][-1]) for i in range(len(ids))],
        "verdicts": {"paged": judge(paged, reference, paged_logits, ref_logits),
                     "dense": judge(dense, reference, dense_logits, ref_logits)},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }  # fmt: skip


def _check(run: dict[str, Any], path: str, tier) -> None:
    verdict: Verdict = run["verdicts"][path]
    tok = run["tokenizer"]
    tier.record(f"gemma3-{path}", {
        "prompts": [p[:60] for p in run["prompts"]], "prompt_tokens": [len(p) for p in run["ids"]],
        "reference": run["reference"], path: run[path], "paged_equals_dense": run["paged"] == run["dense"],
        "seconds": run["seconds"], **verdict.as_dict(),
    })  # fmt: skip
    print(f"\n[tier] Gemma 3 {path}: {verdict.report()}")
    for prompt, got, want in zip(run["prompts"], run[path], run["reference"], strict=True):
        said = f"{prompt[:40]!r}: {tok.decode(got)!r}"
        print("  " + said + ("" if got == want else f" (transformers: {tok.decode(want)!r})"))
    assert verdict.explained, f"{path} decode differs from transformers beyond the arithmetic: {verdict.report()}"


def test_paged_greedy_with_the_window_on_the_kernel_equals_transformers(tier, run):
    _check(run, "paged", tier)


def test_maxtexts_own_dense_greedy_equals_transformers(tier, run):
    _check(run, "dense", tier)


def test_the_kernel_cuts_at_the_window(tier, run):
    """On the chip: the long prompt's prefill logits (its last position) within LOGITS_TOLERANCE of transformers';
    with the window as long as the cache (every layer global) they move by more than WINDOW_EFFECT: the window
    reached the kernel. In the dry run (no long prompt: interpreted, its prefill takes over ten minutes) the seed
    prompt with a 2-token window against the file's: the window set by MaxText's config reaches the kernel."""
    import jax

    from maxtext_compat.testing import real_model as rm

    ids = run["ids"][-1]
    windowed = run["first_logits"][-1]
    if tier.accelerator:
        exact = rm.hf_logits(run["hf"], ids)[len(ids) - 1]
        other_window = (_padded(len(ids) + 1) // PAGE + 1) * PAGE  # as long as the cache: every layer global
    else:
        exact, other_window = windowed, 2
    err = float(np.abs(windowed - exact).max())
    with jax.default_matmul_precision("highest"):
        gen = _paged(run["ckpt"], [ids], 1, sliding_window_size=other_window)
    moved = float(np.abs(np.asarray(gen.steps[0].logits[0][-1]) - exact).max())
    tier.record("gemma3-window", {"prompt_tokens": len(ids), "window": run["ckpt"].shape.sliding_window,
                                  "other_window": other_window, "max_abs_logit_error": err,
                                  "other_window_moved_by": moved, "tolerance": LOGITS_TOLERANCE,
                                  "window_effect": WINDOW_EFFECT})  # fmt: skip
    against = "transformers" if tier.accelerator else "the file's window"
    said = f"\n[tier] Gemma 3 window: {len(ids)} tokens; a window of {other_window} moves the logits {moved:.3g}"
    print(f"{said} from {against}'s" + (f" (the file's window: {err:.3g} from them)" if tier.accelerator else ""))
    assert err < LOGITS_TOLERANCE, err
    assert moved > WINDOW_EFFECT, moved
