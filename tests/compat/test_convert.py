"""Checkpoint conversion on synthetic tensors: the q/k un-permutation, names, shapes and the typed refusals.

The real SmolLM2 file is converted and run against Hugging Face in tests/compat/test_real_model.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

np = pytest.importorskip("numpy")  # the unit environment has none (as every tests/compat module there)

from maxtext_compat.convert import LlamaCheckpoint, LlamaShape, to_maxtext  # noqa: E402
from maxtext_compat.convert.gguf_llama import check_tensors, expected_shapes, hf_name, unpermute  # noqa: E402
from maxtext_compat.errors import WeightsMismatchError  # noqa: E402

pytestmark = pytest.mark.envs("maxtext-0.2.3")  # plain numpy; one environment is enough

SHAPE = LlamaShape(layers=2, hidden=12, mlp=20, heads=3, kv_heads=1, head_dim=4, vocab=30, rope_theta=1e4,
                   rms_eps=1e-5, tied_embeddings=True, context_length=64, bos_token_id=1, eos_token_id=2)  # fmt: skip


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k (LlamaModel.permute), written from its source."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@given(heads=st.integers(1, 6), half=st.integers(1, 8), cols=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_unpermute_undoes_llama_cpps_permutation(heads, half, cols, seed):
    w = np.random.default_rng(seed).standard_normal((heads * 2 * half, cols))
    np.testing.assert_array_equal(unpermute(llama_cpp_permute(w, heads), heads), w)


def test_every_gguf_tensor_name_maps_to_hugging_face():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.17.attn_q.weight") == "model.layers.17.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("rope_freqs.weight") is None  # unknown tensors are reported, never dropped silently


def _tensors(shape: LlamaShape, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v).astype(np.float32) for k, v in expected_shapes(shape).items()}


def test_a_tensor_of_another_shape_is_named_with_both_shapes():
    tensors = _tensors(SHAPE)
    tensors["model.layers.1.self_attn.k_proj.weight"] = np.zeros((8, 12), np.float32)
    with pytest.raises(WeightsMismatchError) as e:
        check_tensors(tensors, expected_shapes(SHAPE), where="m.gguf")
    assert e.value.argument == "model.layers.1.self_attn.k_proj.weight"
    assert "(4, 12)" in str(e.value) and "(8, 12)" in str(e.value)
    assert e.value.mismatched == [("model.layers.1.self_attn.k_proj.weight", (8, 12), (4, 12))]


def test_missing_and_leftover_tensors_are_listed():
    tensors = _tensors(SHAPE)
    del tensors["model.norm.weight"]
    with pytest.raises(WeightsMismatchError) as e:
        check_tensors(tensors, expected_shapes(SHAPE), where="m.gguf", extra=["rope_freqs.weight"])
    assert e.value.missing == ["model.norm.weight"] and e.value.extra == ["rope_freqs.weight"]


def test_the_maxtext_tree_computes_what_the_hugging_face_projections_compute():
    """x @ kernel in MaxText's layout equals the HF projection (q also scaled by 1/sqrt(head_dim))."""
    tensors = _tensors(SHAPE)
    flat = to_maxtext(LlamaCheckpoint(SHAPE, tensors, "synthetic"))
    x = np.random.default_rng(1).standard_normal(SHAPE.hidden).astype(np.float32)
    p, d = "model.layers.1.", "decoder/layers_1/"
    q = np.einsum("e,ehd->hd", x, flat[d + "self_attention/query/kernel"]).reshape(-1)
    np.testing.assert_allclose(q, tensors[p + "self_attn.q_proj.weight"] @ x / 2.0, rtol=1e-6, atol=1e-6)
    k = np.einsum("e,ehd->hd", x, flat[d + "self_attention/key/kernel"]).reshape(-1)
    np.testing.assert_allclose(k, tensors[p + "self_attn.k_proj.weight"] @ x, rtol=1e-6, atol=1e-6)
    a = np.random.default_rng(2).standard_normal((SHAPE.heads, SHAPE.head_dim)).astype(np.float32)
    o = np.einsum("hd,hde->e", a, flat[d + "self_attention/out/kernel"])
    np.testing.assert_allclose(o, tensors[p + "self_attn.o_proj.weight"] @ a.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x @ flat[d + "mlp/wi_0/kernel"], tensors[p + "mlp.gate_proj.weight"] @ x, rtol=1e-5)
    assert "decoder/logits_dense/kernel" not in flat  # tied embeddings: MaxText attends on the embedding table
    assert len(flat) == 2 + 9 * SHAPE.layers


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class _Reader:
    """Just enough of gguf.GGUFReader for the metadata checks: fields by name, no tensors."""

    def __init__(self, **fields):
        self.fields = {k: _Field(v) for k, v in fields.items()}
        self.tensors = []


def test_a_model_of_another_architecture_is_refused_by_name():
    from maxtext_compat.convert.gguf_llama import read_shape
    from maxtext_compat.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as e:
        read_shape(_Reader(**{"general.architecture": "gemma3"}), "g.gguf")
    assert e.value.argument == "general.architecture" and "'gemma3'" in str(e.value) and "llama" in str(e.value)


def test_a_path_that_is_not_a_file_is_refused(tmp_path):
    from maxtext_compat.convert import read_gguf
    from maxtext_compat.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as e:
        read_gguf(tmp_path / "missing.gguf")
    assert e.value.argument == "path" and "missing.gguf" in str(e.value)


def test_a_tokenizer_that_is_not_byte_level_bpe_is_refused():
    from maxtext_compat.convert import tokenizer_from_gguf
    from maxtext_compat.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as e:
        tokenizer_from_gguf(_Reader(**{"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"}))
    assert "llama / default" in str(e.value) and "tokenizer.json" in str(e.value)
