"""The seed's other two families, Llama 3.1 and Qwen 3, written by transformers and decoded equal to it.

No small real checkpoint of either is installable, so maxtext_compat.testing.real_families writes one with
transformers itself (seeded weights, the seed sizes' 32 query heads, 8 key/value heads and head_dim 128 on a width
of 256, 2 layers, a byte-level tokenizer): Llama 3.1 with `rope_scaling` exactly as Llama-3.1-8B's config, Qwen 3
with its per-head query/key RMSNorm and tied embeddings as qwen3-4b. `convert` turns each directory into MaxText's
own model file of the family (`llama3.1-8b`, `qwen3-4b`) with every size overridden; MaxText's dense decode and
the paged decode (MaxText's vLLM call: `vllm_rpa` on 0.2.5, the backport on 0.1.0) must give transformers' greedy
ids for the seed's four prompts, 32 tokens each (`make test`), and Llama 3.1's for a prompt past the RoPE scaling's
cut (`make test-extended`: ~12 min on a shared 2-core CPU).
Transformers' top-1/top-2 margins are asserted above a floor (the weights are scaled so greedy decoding is
decisive: logits of std ~16 for Llama 3.1, ~25 for Qwen 3).
"""

from __future__ import annotations

import functools
import json
import math

import pytest

np = pytest.importorskip("numpy")  # the unit environment has none (as every tests/compat module there)

from maxtext_compat.testing import real_families as rf  # noqa: E402
from maxtext_compat.testing import real_model as rm  # noqa: E402

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")]

FAMILIES = ("llama31", "qwen3")
MARGIN_FLOOR = 0.04  # transformers' smallest top-1/top-2 margin over 4 prompts x 32 steps (measured: 0.049, 0.048)
F32_TOLERANCE = 2e-3  # float32 logits, two implementations (measured 1.0e-4 on Llama 3.1)
BF16_TABLE_TOLERANCE = 0.3  # Qwen 3's tied logits multiply a bfloat16 copy of the table (measured 0.15, std 25)
SCALING_EFFECT = 1.0  # switching Llama 3.1's RoPE scaling off moves the long prompt's last logits by more
LONG_NEW_TOKENS = 4  # the dense decode of the long prompt (a full forward of ~2.1k tokens per token)


def _padded(n: int, to: int = 16) -> int:
    return (n + to - 1) // to * to


class Family:
    """One family's written directory, transformers' reading of it, our conversion and transformers' answers."""

    def __init__(self, name: str) -> None:
        from maxtext_compat.convert import read_hf_dir

        self.name = name
        self.dir = rf.family_dir(name)
        self.tokenizer, self.hf = rf.hf_model(self.dir)
        self.ckpt = read_hf_dir(self.dir)
        self.ids = [self.tokenizer(p).input_ids for p in rf.PROMPTS]
        answers = [rf.hf_greedy_margins(self.hf, ids, rf.NEW_TOKENS) for ids in self.ids]
        self.greedy = [ids for ids, _ in answers]
        self.margins = [m for _, m in answers]


@functools.cache
def _family(name: str) -> Family:
    """One reading per family and process (pytest sets a parametrized module fixture up again when the order of the
    tests switches between its parameters; the two small models stay resident, ~40 MB)."""
    return Family(name)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return _family(request.param)


@pytest.fixture(scope="module")
def dense(family):
    return rm.maxtext_model(family.ckpt, max_len=64)


def test_llama31_and_qwen3_directories_carry_their_familys_features(family):
    """The directory transformers wrote holds the family's features (read back from config.json) and our reading
    of it the same sizes; greedy decoding is decisive (every step's top-1/top-2 margin above MARGIN_FLOOR)."""
    cfg = json.loads((family.dir / "config.json").read_text())
    s = family.ckpt.shape
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (32, 8, 128)
    assert (s.heads, s.kv_heads, s.head_dim, s.hidden, s.layers, s.vocab) == (32, 8, 128, 256, 2, rf.VOCAB)
    rope = cfg.get("rope_parameters") or {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta")}
    if family.name == "llama31":
        assert cfg["architectures"] == ["LlamaForCausalLM"] and not cfg["tie_word_embeddings"]
        assert {k: rope[k] for k in rf.LLAMA31_ROPE_SCALING} == rf.LLAMA31_ROPE_SCALING
        assert rope["rope_theta"] == s.rope_theta == 500000.0 and s.rope_scaling == "llama3" and not s.qk_norm
    else:
        assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["tie_word_embeddings"] and s.tied_embeddings
        assert rope.get("rope_type", "default") == "default" and s.rope_scaling == "none"
        assert s.qk_norm and "model.layers.1.self_attn.k_norm.weight" in family.ckpt.tensors
    state = family.hf.state_dict()
    for name, ours in family.ckpt.tensors.items():
        np.testing.assert_array_equal(ours, state[name].numpy(), err_msg=name)
    assert min(min(m) for m in family.margins) > MARGIN_FLOOR, [min(m) for m in family.margins]


def test_llama31_and_qwen3_convert_into_maxtexts_family_configs(family, tmp_path):
    """`convert` writes the family's MaxText model file with the feature's key, and the installed MaxText's own
    loader restores the checkpoint into logits equal to transformers'."""
    from maxtext_compat.convert import convert

    result = convert(family.dir, tmp_path / family.name)
    keys = json.loads((tmp_path / family.name / "maxtext_config.json").read_text())
    if family.name == "llama31":
        assert keys["model_name"] == "llama3.1-8b" and keys["rope_use_scale"] is True
    else:
        assert keys["model_name"] == "qwen3-4b" and keys["use_qk_norm"] is True and keys["logits_via_embedding"]
    assert keys["override_model_config"] is True and result.checkpoint
    _, logits_fn = rm.loaded_by_maxtext(result.out, max_len=32)
    ids = family.ids[3]
    tokens = np.zeros((1, 32), np.int32)
    tokens[0, : len(ids)] = ids
    ours = np.asarray(logits_fn(tokens))[0, : len(ids)]
    exact = rm.hf_logits(family.hf, ids)
    tolerance = F32_TOLERANCE if family.name == "llama31" else BF16_TABLE_TOLERANCE
    assert np.abs(ours - exact).max() < tolerance
    assert (ours.argmax(-1) == exact.argmax(-1)).all()


def test_llama31_and_qwen3_dense_greedy_equals_transformers(family, dense):
    ours = rm.maxtext_greedy(*dense, family.ids, rf.NEW_TOKENS)
    for prompt, got, want in zip(rf.PROMPTS, ours, family.greedy, strict=True):
        assert got == want, f"{family.name} {prompt!r}: MaxText {got} vs transformers {want}"


def test_llama31_and_qwen3_logits_equal_transformers(family, dense):
    """Llama 3.1 (its own output head) within F32_TOLERANCE; Qwen 3's tied logits equal transformers' final hidden
    state times the bfloat16-rounded table within F32_TOLERANCE, and its float32 logits within BF16_TABLE_TOLERANCE."""
    ids = family.ids[3]
    ours = rm.maxtext_logits(*dense, [ids])[0, : len(ids)]
    exact = rm.hf_logits(family.hf, ids)
    if family.name == "qwen3":
        hidden = rm.hf_final_hidden(family.hf, ids)
        table = family.ckpt.tensors["model.embed_tokens.weight"]
        np.testing.assert_allclose(ours, hidden @ rm.bf16_rounded(table).T, rtol=0, atol=F32_TOLERANCE)
        np.testing.assert_allclose(ours, exact, rtol=0, atol=BF16_TABLE_TOLERANCE)
    else:
        np.testing.assert_allclose(ours, exact, rtol=0, atol=F32_TOLERANCE)


@pytest.fixture
def server_kernel():
    """The RPA kernel a CPU `vllm serve` runs (maxtext_compat.kernel.rpa_xla, held to the real kernel by
    test_rpa_xla.py), patched in for the test only: the real kernel in Pallas interpret mode is far slower."""
    from maxtext_compat.cpu import serving as cpu_serving

    was_on = cpu_serving.installed()
    status = cpu_serving.install(parts=("rpa",))
    assert status.active and status.kernel == "xla", status
    yield status
    if not was_on:
        cpu_serving.uninstall()


def _paged(ckpt, prompts, new_tokens, name, chunk=None):
    """Greedy ids by the paged decode; `chunk`: a chunked prefill of at most that many tokens per call (the XLA RPA
    kernel gathers every query's context: a 2k-token prefill in one call would need ~37 GB here)."""
    from maxtext_compat.decode import Buckets, PagedEngine
    from maxtext_compat.testing import real_gemma3 as g3

    page = 16
    pages = _padded(max(len(p) for p in prompts) + new_tokens) // page + 1
    model = g3.paged_model(ckpt, max_len=pages * page, name=name)
    rows = chunk * len(prompts) if chunk else _padded(sum(len(p) for p in prompts))
    buckets = Buckets(max_num_tokens=rows, max_num_seqs=len(prompts), pages_per_seq=pages,
                      decode_tokens=_padded(len(prompts), 8))  # fmt: skip
    engine = PagedEngine(model, num_pages=len(prompts) * pages + 1, page_size=page, buckets=buckets)
    return engine.generate(prompts, new_tokens - 1, prefill_chunk=chunk).tokens()


def test_llama31_and_qwen3_paged_decode_equals_transformers(family, server_kernel):
    """The vLLM call (0.2.5: MaxText's vllm_rpa attention; 0.1.0: the backport), one ragged prefill of the four
    prompts then 31 decode steps: transformers' 32 ids for each."""
    got = _paged(family.ckpt, family.ids, rf.NEW_TOKENS, family.name)
    for prompt, ours, want in zip(rf.PROMPTS, got, family.greedy, strict=True):
        assert ours == want, f"{family.name} {prompt!r}: paged {ours} vs transformers {want}"


def _angle_change(theta: float, head_dim: int, position: int) -> float:
    """The largest change llama3 scaling makes to a RoPE angle at `position`, written from Meta's reference
    (llama-models' apply_scaling): wavelengths under 8192/4 kept, over 8192/1 divided by 8, smoothed between."""
    factor, low, high, old = 8.0, 1.0, 4.0, 8192.0
    worst = 0.0
    for i in range(head_dim // 2):
        freq = theta ** (-2 * i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            scaled = freq
        elif wavelen > old / low:
            scaled = freq / factor
        else:
            smooth = (old / wavelen - low) / (high - low)
            scaled = (1 - smooth) * freq / factor + smooth * freq
        worst = max(worst, position * (freq - scaled))
    return worst


@pytest.fixture(scope="module")
def llama31():
    fam = _family("llama31")
    long_ids = fam.tokenizer(rf.LONG_PROMPT).input_ids
    want, margins = rf.hf_greedy_margins(fam.hf, long_ids, rf.NEW_TOKENS)
    return fam, long_ids, want, margins


def test_llama31_long_prompt_is_past_the_scaling_cut_and_the_scaling_matters(llama31):
    """Why ~2,070 tokens is long enough. llama3 scaling keeps RoPE frequencies whose wavelength is under
    8192 / high_freq_factor = 2048 tokens, divides those over 8192 / low_freq_factor = 8192 by 8 and blends between.
    With head_dim 128 and rope_theta 500000 pair i turns at 500000^(-i/64) rad per token: pairs 29-35 (wavelengths
    2.4k-8.1k) are blended and 36-63 divided, 35 of 64 pairs. An angle moves by position x (f - f_scaled): at most
    ~9e-4 rad per token (wavelength ~4.4k), so under 0.06 rad anywhere in the seed's prompts (< 64 tokens) but
    ~1.8 rad at the end of the long prompt, which is longer than the 2048-token cut where scaling begins."""
    _, long_ids, _, margins = llama31
    assert len(long_ids) > 8192 / 4
    assert _angle_change(500000.0, 128, 64) < 0.06
    assert _angle_change(500000.0, 128, len(long_ids)) > 1.5
    assert min(margins) > MARGIN_FLOOR, min(margins)


@pytest.fixture(scope="module")
def long_dense(llama31):
    fam, long_ids, _, _ = llama31
    return rm.maxtext_model(fam.ckpt, max_len=_padded(len(long_ids) + LONG_NEW_TOKENS))


@pytest.mark.extended  # ~2.5 min on a shared 2-core CPU (a full forward of ~2.1k tokens per greedy token)
def test_llama31_dense_decode_past_the_scaling_cut_equals_transformers(llama31, long_dense):
    """MaxText's dense greedy ids of the long prompt equal transformers'; its logits at every position are within
    F32_TOLERANCE; the same model with the scaling switched off (rope_use_scale=False: MaxText's own switch) is
    further than SCALING_EFFECT from transformers at the last position, so the scaling is what makes them equal."""
    fam, long_ids, want, _ = llama31
    got = rm.maxtext_greedy(*long_dense, [long_ids], LONG_NEW_TOKENS)[0]
    assert got == want[:LONG_NEW_TOKENS]
    ours = rm.maxtext_logits(*long_dense, [long_ids])[0, : len(long_ids)]
    exact = rm.hf_logits(fam.hf, long_ids)
    assert np.abs(ours - exact).max() < F32_TOLERANCE
    unscaled_model = rm.maxtext_model(fam.ckpt, max_len=int(long_dense[0].max_target_length), rope_use_scale=False)
    unscaled = rm.maxtext_logits(*unscaled_model, [long_ids])[0, : len(long_ids)]
    effect = np.abs(unscaled[-1] - exact[-1]).max()
    print(f"llama31 scaling off: last-position logits move by {effect:.3f} (tolerance {F32_TOLERANCE})")
    assert effect > SCALING_EFFECT


@pytest.mark.extended  # ~9 min on a shared 2-core CPU: the XLA RPA kernel gathers each query's whole context
def test_llama31_paged_decode_past_the_scaling_cut_equals_transformers(llama31, server_kernel):
    """The long prompt's 32 greedy ids through the paged decode (a chunked prefill of 128-token calls, then 31 decode
    steps) equal transformers'."""
    fam, long_ids, want, _ = llama31
    assert _paged(fam.ckpt, [long_ids], rf.NEW_TOKENS, "Llama 3.1", chunk=128)[0] == want


def _llama31_8b_config(**changes):
    """Llama-3.1-8B's config.json as Meta publishes it (rope keys in transformers 4's form), sizes made small."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 320,
           "rope_theta": 500000.0, "rope_scaling": dict(rf.LLAMA31_ROPE_SCALING), "hidden_act": "silu",
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": False}  # fmt: skip
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            cfg[outer][inner] = value
        else:
            cfg[key] = value
    return cfg


def test_llama31_config_maxtext_cannot_hold_is_a_typed_error():
    """Meta's own rope_scaling form reads as llama3 scaling; another rope_type, other constants than the ones
    MaxText's LLaMARotaryEmbedding fixes, or biases are refused naming the key."""
    from maxtext_compat.convert.hf_dir import shape_from_config
    from maxtext_compat.errors import InvalidArgumentError

    shape = shape_from_config(_llama31_8b_config())
    assert (shape.rope_scaling, shape.rope_theta) == ("llama3", 500000.0)
    refused = {"rope_scaling.rope_type": "yarn", "rope_scaling.factor": 16.0,
               "rope_scaling.original_max_position_embeddings": 4096, "attention_bias": True}  # fmt: skip
    for key, value in refused.items():
        with pytest.raises(InvalidArgumentError) as err:
            shape_from_config(_llama31_8b_config(**{key: value}))
        assert err.value.argument == key and err.value.fix
    qwen = {**_llama31_8b_config(), "model_type": "qwen3", "use_sliding_window": True}
    with pytest.raises(InvalidArgumentError) as err:
        shape_from_config(qwen)
    assert err.value.argument == "use_sliding_window"
