"""The second real model: Gemma 3 270M (Q4_K_M) from PyPI chunk packages, converted and decoded equal to transformers.

Gemma 3 is where attention differs most on this project's path: five local sliding-window layers (window 512,
RoPE base 10k) to one global layer (RoPE base 1M), q/k norms, a query scale of 1/sqrt(256), a 262k tied embedding
scaled by sqrt(640). The assembled GGUF file is read and dequantized (gguf, K-quants included) into transformers'
tensor names and from there into MaxText's gemma3 tree (maxtext_compat.convert). The independent reference is
transformers reading the same file (its own GGUF loader, tokenizer and Gemma3ForCausalLM), cached between runs
like SmolLM2's. MaxText's own dense decode and the paged decode (MaxText's vLLM call through the RPA kernel, its
`sliding_window` set for the local layers) must give transformers' greedy tokens for the seed's prompts and for a
prompt longer than the window; a token that differs must be explained by the margin rule (tests/helpers/token_margin).
The seed's prompts run in `make test`; the 553-token prompt (dense, logits, paged: ~5 min on a shared 2-core CPU)
in `make test-extended`.
"""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")  # the unit environment has none (as every tests/compat module there)

from helpers import token_margin  # noqa: E402
from maxtext_compat.testing import real_gemma3 as g3  # noqa: E402
from maxtext_compat.testing import real_model as rm  # noqa: E402

# make test-extended's (~8 min of a 2-core machine, cold): make test holds Gemma 3 270M to transformers through the
# demo's run in maxtext-0.2.5 (tests/compat/test_demo.py: paged greedy, its window, against transformers' ids).
pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011"),
    pytest.mark.extended,
]

# MaxText multiplies the final hidden state by a bfloat16 copy of the (sqrt(640)-scaled) tied table in every
# release; over a 262k vocabulary that moves logits by up to LOGITS_TOLERANCE (measured: see the docstring of
# test_the_long_prompt_logits_are_transformers_and_the_window_cuts: 0.14 on MaxText 0.2.5).
LOGITS_TOLERANCE = 0.25
WINDOW_EFFECT = 0.5  # dropping the window must move the long prompt's last logits by more than this


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


@pytest.fixture(scope="module")
def gemma3():
    """(our Gemma3Checkpoint, our tokenizer, ids of the seed's prompts, ids of LONG_PROMPT): read once."""
    from maxtext_compat.convert import read_source

    ckpt, tokenizer, _ = read_source(g3.gemma3_gguf())
    ids = [tokenizer.encode(p).ids for p in g3.PROMPTS]
    return ckpt, tokenizer, ids, tokenizer.encode(g3.LONG_PROMPT).ids


@pytest.fixture(scope="module")
def reference():
    from maxtext_compat.runner.caches import hf_reference_dir

    return g3.reference(g3.gemma3_gguf(), hf_reference_dir())


@pytest.fixture(scope="class")
def long_dense(gemma3):
    ckpt, _, _, long_ids = gemma3
    return rm.maxtext_model(ckpt, max_len=_padded(len(long_ids) + g3.LONG_NEW_TOKENS))


def test_the_metadata_describes_gemma3_270m_as_transformers_reads_it(gemma3, reference):
    s, cfg = gemma3[0].shape, reference.model.config
    assert (s.layers, s.hidden, s.mlp, s.heads, s.kv_heads, s.head_dim, s.vocab) == (
        cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size,
    )  # fmt: skip
    assert s.sliding_window == cfg.sliding_window == 512
    assert [s.layer_is_global(i) for i in range(s.layers)] == [t == "full_attention" for t in cfg.layer_types]
    rope = cfg.rope_parameters
    assert (s.rope_theta, s.local_rope_theta) == (rope["full_attention"]["rope_theta"],
                                                  rope["sliding_attention"]["rope_theta"])  # fmt: skip
    assert s.query_pre_attn_scalar == cfg.query_pre_attn_scalar
    assert not cfg.attn_logit_softcapping and not cfg.final_logit_softcapping
    assert (s.attn_logit_softcap, s.final_logit_softcap) == (0.0, 0.0)
    assert s.tied_embeddings and cfg.tie_word_embeddings and s.bos_token_id == g3.BOS == cfg.bos_token_id


def test_our_conversion_equals_transformers_reading_of_the_file(gemma3, reference):
    """Every tensor (K-quants dequantized, norms as w) equal to transformers' state dict; our tokenizer's ids (with
    the BOS the file says to add) equal transformers' ids with that BOS in front."""
    ckpt, _, ids, long_ids = gemma3
    assert [*ids, long_ids] == reference.prompt_ids
    assert len(long_ids) > ckpt.shape.sliding_window + 16
    state = reference.model.state_dict()
    for name, ours in ckpt.tensors.items():
        np.testing.assert_array_equal(ours, state[name].numpy(), err_msg=name)
    assert {k for k in state if k != "lm_head.weight"} == set(ckpt.tensors)


def test_maxtext_dense_greedy_equals_transformers_for_the_seeds_prompts(gemma3, reference):
    ckpt, tokenizer, ids, _ = gemma3
    ours = rm.maxtext_greedy(*rm.maxtext_model(ckpt, max_len=32), ids)
    for prompt, got, want in zip(g3.PROMPTS, ours, reference.greedy, strict=False):
        assert got == want, f"{prompt!r}: MaxText {tokenizer.decode(got)!r} vs reference {tokenizer.decode(want)!r}"


@pytest.mark.extended  # ~2.5 min on a shared 2-core CPU (a 553-token sequence over a 262k vocabulary)
class TestPastTheWindow:
    """The long prompt through MaxText's dense forward; the model is dropped when the class ends (peak memory)."""

    def test_maxtext_dense_greedy_equals_transformers_past_the_window(self, gemma3, reference, long_dense):
        _, tokenizer, _, long_ids = gemma3
        got = rm.maxtext_greedy(*long_dense, [long_ids], g3.LONG_NEW_TOKENS)[0]
        want = reference.greedy[-1][: g3.LONG_NEW_TOKENS]
        assert got == want, f"MaxText {tokenizer.decode(got)!r} vs reference {tokenizer.decode(want)!r}"

    def test_the_long_prompt_logits_are_transformers_and_the_window_cuts(self, gemma3, reference, long_dense):
        """MaxText's logits of every position of the long prompt within LOGITS_TOLERANCE of transformers' (argmax equal
        wherever transformers' top-2 margin exceeds twice the tolerance); the same model with the window switched off
        (a window as long as the sequence) differs by more than WINDOW_EFFECT at the last position, so the local layers
        really cut there."""
        ckpt, _, _, long_ids = gemma3
        ours = rm.maxtext_logits(*long_dense, [long_ids])[0, : len(long_ids)]
        exact = rm.hf_logits(reference.model, long_ids)
        err = np.abs(ours - exact).max()
        assert err < LOGITS_TOLERANCE, err
        top2 = np.sort(exact, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * LOGITS_TOLERANCE
        assert (ours.argmax(-1) == exact.argmax(-1))[clear].all()
        cfg = long_dense[0]
        everything = int(cfg.max_target_length)  # a window as long as the sequence: every layer attends globally
        no_window = rm.maxtext_model(ckpt, max_len=everything, sliding_window_size=everything)
        unwindowed = rm.maxtext_logits(*no_window, [long_ids])[0, : len(long_ids)]
        w = ckpt.shape.sliding_window
        assert np.abs(unwindowed[:w] - ours[:w]).max() < 1e-3  # before the window fills, the window changes nothing
        assert np.abs(unwindowed[-1] - exact[-1]).max() > WINDOW_EFFECT


@pytest.fixture
def server_kernel():
    """The RPA kernel a CPU `vllm serve` runs (maxtext_compat.kernel.rpa_xla: the v3 kernel's semantics, sliding window
    included, held to the real kernel by test_rpa_xla.py), patched in for this test only: the real kernel in Pallas
    interpret mode takes over ten minutes for a 553-token prefill on this CPU."""
    from maxtext_compat.cpu import serving as cpu_serving

    was_on = cpu_serving.installed()
    status = cpu_serving.install(parts=("rpa",))
    assert status.active and status.kernel == "xla", status
    yield status
    if not was_on:
        cpu_serving.uninstall()


@pytest.mark.extended  # ~2 min on a shared 2-core CPU (prefill of 553 tokens, logits over 262k per position)
def test_paged_decode_with_the_window_equals_transformers_past_the_window(gemma3, reference, server_kernel):
    """The vLLM call (0.2.x: MaxText's own vllm_rpa attention, its local layers passing the window to the kernel;
    0.1.0: the backport) with a ragged prefill of the long prompt, then decode steps: transformers' tokens, or a
    difference the margin rule explains."""
    from maxtext_compat.decode import Buckets, PagedEngine

    ckpt, tokenizer, _, long_ids = gemma3
    n = g3.LONG_NEW_TOKENS
    page = 16
    pages = _padded(len(long_ids) + n) // page + 1
    model = g3.paged_model(ckpt, max_len=pages * page)
    buckets = Buckets(max_num_tokens=_padded(len(long_ids)), max_num_seqs=1, pages_per_seq=pages)
    engine = PagedEngine(model, num_pages=pages + 1, page_size=page, buckets=buckets)
    gen = engine.generate([long_ids], n - 1)
    got, want = gen.tokens()[0], reference.greedy[-1][:n]
    if got != want:
        context = [*long_ids, *want]
        exact = rm.hf_logits(reference.model, context)[len(long_ids) - 1 : len(long_ids) - 1 + n]
        ours = [step.logits[0][-1] for step in gen.steps]
        verdict = token_margin.judge([got], [want], [ours], [list(exact)])
        assert verdict.explained, f"paged {tokenizer.decode(got)!r} vs {tokenizer.decode(want)!r}: {verdict.report()}"


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class _Reader:
    """The metadata of a Gemma 3 270M file, without its tensors (read_gemma3_shape reads only names and fields)."""

    def __init__(self, **changes):
        fields = {"general.architecture": "gemma3", "gemma3.context_length": 32768, "gemma3.embedding_length": 640,
                  "gemma3.block_count": 18, "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
                  "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
                  "gemma3.attention.value_length": 256, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
                  "gemma3.rope.freq_base": 1e6, "gemma3.attention.sliding_window": 512,
                  "tokenizer.ggml.tokens": ["x"] * 8}  # fmt: skip
        fields |= changes
        self.fields = {k: _Field(v) for k, v in fields.items() if v is not None}
        self.tensors = []


def test_a_fact_the_file_does_not_give_is_a_typed_error():
    from maxtext_compat.convert.gguf_gemma3 import read_gemma3_shape
    from maxtext_compat.errors import InvalidArgumentError

    shape = read_gemma3_shape(_Reader())
    assert (shape.sliding_window, shape.sliding_window_pattern, shape.local_rope_theta) == (512, 6, 10000.0)
    assert read_gemma3_shape(_Reader(**{"gemma3.rope.freq_base_swa": 5e4})).local_rope_theta == 5e4  # the file wins
    for key in ("gemma3.attention.sliding_window", "gemma3.rope.freq_base", "gemma3.attention.key_length"):
        with pytest.raises(InvalidArgumentError) as err:
            read_gemma3_shape(_Reader(**{key: None}))
        assert err.value.argument == key and err.value.found == "absent"
    refused = {"gemma3.attention.sliding_window_pattern": 4, "gemma3.rope.scaling.type": "linear",
               "gemma3.attention.value_length": 128, "gemma3.block_count": 62}  # fmt: skip
    for key, value in refused.items():
        with pytest.raises(InvalidArgumentError) as err:
            read_gemma3_shape(_Reader(**{key: value}))
        assert err.value.argument == key and err.value.fix


def test_a_scanned_gemma3_checkpoint_is_refused_before_anything_is_written(gemma3):
    from maxtext_compat.convert.maxtext_checkpoint import checkpoint_overrides
    from maxtext_compat.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as err:
        checkpoint_overrides(gemma3[0], scan_layers=True)
    assert err.value.argument == "scan_layers"


def test_the_conversion_writes_gemma3s_chat_template_as_maxtext_ships_it(gemma3, tmp_path, mocker):
    """The file carries no template, so `convert` writes the family's (convert/chat_template.py); our packaged text
    equals MaxText's own file wherever the installed release ships one (0.2.4 and later), and transformers' tokenizer
    of the written directory renders a chat with it. `read_source` hands back the module's reading of the same file
    (reading it again would only cost time)."""
    import importlib.metadata
    import json

    from packaging.version import Version
    from transformers import AutoTokenizer

    from maxtext_compat.convert import convert
    from maxtext_compat.convert.chat_template import family_template

    ckpt, tokenizer, _, _ = gemma3
    mocker.patch("maxtext_compat.convert.job.read_source", return_value=(ckpt, tokenizer, None))
    result = convert(g3.gemma3_gguf(), tmp_path / "gemma3", checkpoint=False)
    assert result.chat_template_source == "family" and "gemma-3-27b-chat_template.json" in result.chat_template_note
    written = json.loads((tmp_path / "gemma3" / "tokenizer_config.json").read_text())["chat_template"]
    assert written == family_template("gemma3")
    shipped = g3.maxtext_shipped_template()
    if shipped is not None:
        assert written == shipped
    else:
        release = importlib.metadata.version("maxtext")
        assert Version(release) < Version("0.2.4"), release  # the releases that ship none
    question = [{"role": "user", "content": "What is the capital of France?"}]
    hf_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "gemma3"))
    ids = hf_tokenizer.apply_chat_template(question, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns a BatchEncoding
    want = tokenizer.encode("<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
                            "<start_of_turn>model\n", add_special_tokens=False).ids  # fmt: skip
    assert list(ids) == want and want.count(g3.BOS) == 1
