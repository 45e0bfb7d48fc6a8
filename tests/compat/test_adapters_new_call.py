"""New calls through the adapters: native equality on 0.2.5, the backport on 0.1.0, strict mode, refusals.

The new path runs the real tpu-inference RPA kernel (CPU interpret mode). Outputs and every
KV cache are compared element for element with MaxText's own new call on 0.2.5.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.needs_maxtext

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from maxtext_compat import paged  # noqa: E402
from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.convention import policy  # noqa: E402
from maxtext_compat.errors import (  # noqa: E402
    InvalidArgumentError,
    InvalidArgumentTypeError,
    KernelUnavailableError,
    KVCacheNotUpdatedError,
)
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
NATIVE = ROW.has_kv_params
KERNEL_ENVS = ("maxtext-0.2.5", "maxtext-0.2.1", "maxtext-0.1.0-jax011")
PAGES, PAGE, TOKENS = 8, 16, 40


@pytest.fixture(scope="module")
def shim():
    if os.environ.get("MAXTEXT_COMPAT_ENV") not in KERNEL_ENVS:
        return None
    from maxtext_compat.cpu import rpa as cpu_rpa

    status = cpu_rpa.install()
    assert status.active, status.reason
    return status


def _mesh(cfg):
    if NATIVE:  # vllm.yml meshes have no ici knob for 'model': one device, every axis 1
        from jax.sharding import Mesh

        return Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
    return tiny.tiny_mesh(cfg)


class Step:
    """One prefill step of two ragged sequences (20 and 13 tokens) in kernel order."""

    def __init__(self, cfg, layers: int):
        self.layout = paged.KVCacheLayout(PAGES, PAGE, cfg.num_kv_heads, cfg.head_dim, "float32")
        self.caches = self.layout.allocate(layers)
        alloc = paged.PageAllocator(PAGES, PAGE)
        seqs = [paged.SequenceSlice(n, n, alloc.allocate(s, n), s) for s, n in (("A", 20), ("C", 13))]
        self.md = paged.build_metadata(seqs, self.layout, max_num_tokens=TOKENS, max_num_seqs=4, pages_per_seq=2)
        rng = np.random.default_rng(0)
        self.x = jnp.asarray(rng.standard_normal((TOKENS, 1, cfg.emb_dim)).astype(np.float32))
        self.tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (TOKENS, 1)).astype(np.int32))
        pos = np.concatenate([np.arange(20), np.arange(13)]).astype(np.int32)
        self.pos = jnp.asarray(self.md.to_kernel_order(pos))[:, None]
        self.attention_metadata = self.md.to_attention_metadata()


@pytest.fixture(scope="module")
def vllm_model(shim):
    cfg = tiny.tiny_config("default", vllm=NATIVE)
    mesh = _mesh(cfg)
    model = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if NATIVE else None)
    return cfg, mesh, model, Step(cfg, cfg.num_decoder_layers)


def _attention_step(m, x, pos, kv, md):
    return m(x, x, pos, None, model_mode="autoregressive", deterministic=True, kv_cache=kv, attention_metadata=md)


def _transformer_step(m, tok, pos, kvs, md):
    return m(tok, pos, kv_caches=kvs, attention_metadata=md, model_mode="autoregressive")


def _equal(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.envs("maxtext-0.2.5")
def test_attention_new_call_equals_native_new_call(vllm_model):
    cfg, mesh, _model, step = vllm_model
    attn = tiny.tiny_attention(cfg, mesh, model_mode="autoregressive", batch=TOKENS, seq=1)
    run = nnx.jit(_attention_step)
    with tiny.mesh_context(cfg, mesh):
        native_out, native_kv = run(attn, step.x, step.pos, step.caches[0], step.attention_metadata)
        out, kv = run(wrap(attn), step.x, step.pos, step.caches[0], step.attention_metadata)
    _equal(out, native_out)
    _equal(kv, native_kv)
    assert not np.array_equal(np.asarray(kv), np.asarray(step.caches[0]))  # the step really wrote the cache


@pytest.mark.envs("maxtext-0.2.5")
def test_transformer_new_call_equals_native_every_kv_cache(vllm_model):
    cfg, mesh, model, step = vllm_model
    run = nnx.jit(_transformer_step)
    with tiny.mesh_context(cfg, mesh):
        native_hidden, native_kvs = run(model, step.tokens, step.pos, list(step.caches), step.attention_metadata)
        hidden, kvs = run(wrap(model), step.tokens, step.pos, list(step.caches), step.attention_metadata)
    _equal(hidden, native_hidden)
    assert len(kvs) == len(native_kvs) == cfg.num_decoder_layers
    for a, b in zip(kvs, native_kvs, strict=True):
        _equal(a, b)


@pytest.mark.envs("maxtext-0.2.5")
def test_decoder_and_layer_new_calls_return_the_new_convention(vllm_model):
    cfg, mesh, model, step = vllm_model

    def decoder_step(m, dec, tok, pos, kvs, md):
        return dec(m.token_embedder, tok, pos, kv_caches=kvs, attention_metadata=md, model_mode="autoregressive")

    def layer_step(layer, x, pos, kv, md):
        return layer(x, None, pos, True, "autoregressive", kv_cache=kv, attention_metadata=md)

    layer_cls = ROW.decoder_layers["llama2"].load()
    layer = layer_cls(config=cfg, model_mode="autoregressive", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1))
    with tiny.mesh_context(cfg, mesh):
        native = nnx.jit(decoder_step)(
            model, model.decoder, step.tokens, step.pos, list(step.caches), step.attention_metadata
        )
        ours = nnx.jit(decoder_step)(
            model, wrap(model.decoder), step.tokens, step.pos, list(step.caches), step.attention_metadata
        )
        y_native, kv_native = nnx.jit(layer_step)(layer, step.x, step.pos, step.caches[0], step.attention_metadata)
        y, kv = nnx.jit(layer_step)(wrap(layer), step.x, step.pos, step.caches[0], step.attention_metadata)
    assert len(ours) == 3  # (logits, hidden, kv_caches); logits is None under attention="vllm_rpa", as MaxText
    _equal(ours[1], native[1])
    for a, b in zip(ours[2], native[2], strict=True):
        _equal(a, b)
    _equal(y, y_native)
    _equal(kv, kv_native)


@pytest.mark.envs("maxtext-0.2.5")
def test_old_call_on_a_vllm_config_transformer_returns_logits(vllm_model):
    """MaxText returns (hidden, kv_caches) under attention="vllm_rpa" even when called the old way."""
    cfg, mesh, model, _ = vllm_model
    inp = tiny.tiny_inputs(cfg, batch=1, seq=8)
    call = nnx.jit(lambda m, t, p: m(t, p, decoder_segment_ids=None, enable_dropout=False, model_mode="train"))
    with tiny.mesh_context(cfg, mesh):
        native = call(model, inp["tokens"], inp["positions"])
        logits = call(wrap(model), inp["tokens"], inp["positions"])
    assert isinstance(native, tuple)
    assert isinstance(logits, jax.Array) and logits.shape == (1, 8, cfg.vocab_size)


@pytest.mark.envs("maxtext-0.1.0-jax011")
def test_backport_attention_matches_the_layers_own_train_mode_attention(vllm_model):
    cfg, mesh, _, step = vllm_model
    attn = wrap(tiny.tiny_attention(cfg, mesh, batch=1, seq=20))
    x = np.asarray(step.md.from_kernel_order(np.asarray(step.x)[:, 0]))
    full = {"A": x[:20], "C": x[20:33]}
    call = nnx.jit(lambda m, x, p: m(x, x, p, jnp.ones(p.shape, jnp.int32), model_mode="train", deterministic=True))
    with tiny.mesh_context(cfg, mesh):
        ref = np.concatenate(
            [
                np.asarray(call(attn, jnp.asarray(v)[None], jnp.arange(len(v), dtype=jnp.int32)[None]))[0]
                for v in full.values()
            ]
        )
        out, kv = nnx.jit(_attention_step)(attn, step.x, step.pos, step.caches[0], step.attention_metadata)
    got = step.md.from_kernel_order(np.asarray(out)[:, 0])[:33]
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)  # measured: ~8e-7
    k, _v = paged.read_kv(kv, step.layout, step.md.pages_of(0), step.md.kv_lens[0])
    assert np.isfinite(np.asarray(k)).all() and np.abs(np.asarray(k)).max() > 0


@pytest.mark.envs("maxtext-0.1.0-jax011")
def test_backport_refuses_a_scanned_stack_with_the_fix():
    from maxtext_compat.errors import BackportError

    cfg = tiny.tiny_config("default", scan_layers=True)
    mesh = tiny.tiny_mesh(cfg)
    model = wrap(tiny.tiny_transformer(cfg, mesh))
    step = Step(cfg, cfg.num_decoder_layers)
    with tiny.mesh_context(cfg, mesh), pytest.raises(BackportError, match="unscanned decoder") as e:
        nnx.jit(_transformer_step)(model, step.tokens, step.pos, list(step.caches), step.attention_metadata)
    assert "scan_layers=False" in str(e.value)


@pytest.mark.envs("maxtext-0.1.0")
def test_new_call_without_tpu_inference_names_the_fix():
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    attn = wrap(tiny.tiny_attention(cfg, mesh, batch=TOKENS, seq=1))
    with tiny.mesh_context(cfg, mesh), pytest.raises(KernelUnavailableError, match="tpu-inference is not installed"):
        x = jnp.zeros((TOKENS, 1, cfg.emb_dim))
        attn(x, x, jnp.zeros((TOKENS, 1), jnp.int32), None, model_mode="autoregressive", kv_cache=jnp.zeros((1,)),
             attention_metadata=object())  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Arguments the installed release cannot take
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain():
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    return cfg, mesh, wrap(tiny.tiny_attention(cfg, mesh))


def _call_attention(attn, cfg, **kw):
    inp = tiny.tiny_inputs(cfg)
    return attn(inp["x"], inp["x"], inp["positions"], inp["segment_ids"], deterministic=True, **kw)


@pytest.mark.envs("maxtext-0.2.5")
def test_page_state_on_a_release_without_paged_attention_is_refused(plain):
    cfg, mesh, attn = plain
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentError) as e:
        _call_attention(attn, cfg, page_state=object())
    msg = str(e.value)
    assert "[page_state]" in msg and "MaxText 0.2.5" in msg and "PR #3948" in msg and "kv_cache=" in msg


@pytest.mark.envs("maxtext-0.2.5")
def test_new_call_needs_a_vllm_config_to_write_the_cache(plain, shim):
    cfg, mesh, attn = plain
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentError) as e:
        _call_attention(attn, cfg, model_mode="autoregressive", kv_cache=jnp.zeros((1,)), attention_metadata=object())
    assert "attention='vllm_rpa'" in str(e.value) and "vllm.yml" in str(e.value)


@pytest.mark.parametrize("missing", ["kv_cache", "attention_metadata"])
def test_a_writing_new_call_needs_both_cache_and_metadata(plain, missing):
    cfg, mesh, attn = plain
    given = {"kv_cache": jnp.zeros((1,)), "attention_metadata": object()}
    given.pop(missing)
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentError) as e:
        _call_attention(attn, cfg, model_mode="autoregressive", **given)
    assert f"[{missing}]" in str(e.value) and "needs both" in str(e.value)


@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011")
@pytest.mark.parametrize(
    "name,value,words",
    [
        ("rope_kwargs", {"max_timescale": 10}, "RoPE takes no per-call arguments"),
        ("shared_key", "k", "needs MaxText 0.2.3 or newer"),
        ("shared_value", "v", "needs MaxText 0.2.3 or newer"),
    ],
)
def test_parameters_0_1_0_lacks_are_refused_with_the_alternative(plain, name, value, words):
    cfg, mesh, attn = plain
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentError) as e:
        _call_attention(attn, cfg, **{name: value})
    assert f"[{name}]" in str(e.value) and "MaxText 0.1.0" in str(e.value) and words in str(e.value)


@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011")
def test_out_sharding_is_translated_on_0_1_0(plain):
    from jax.sharding import NamedSharding, PartitionSpec

    cfg, mesh, attn = plain
    sharding = NamedSharding(mesh, PartitionSpec())
    call = nnx.jit(lambda m, x, p, s, **kw: m(x, x, p, s, model_mode="train", deterministic=True, **kw))
    inp = tiny.tiny_inputs(cfg)
    with tiny.mesh_context(cfg, mesh):
        plain_out = call(attn, inp["x"], inp["positions"], inp["segment_ids"])
        sharded = nnx.jit(lambda m, x, p, s: m(x, x, p, s, sharding, model_mode="train", deterministic=True))(
            attn, inp["x"], inp["positions"], inp["segment_ids"]
        )  # positional, as 0.2.x callers pass it
    _equal(sharded, plain_out)


def test_unknown_arguments_are_a_type_error_showing_the_signature(plain):
    cfg, mesh, attn = plain
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentTypeError) as e:
        _call_attention(attn, cfg, kv_caches=[1])
    assert "kv_caches" in str(e.value) and "Expected: Attention.__call__(inputs_q" in str(e.value)
    assert "kv_cache" in str(e.value).split("Expected:")[1]  # the advertised signature is shown


@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011")
def test_model_mode_fixed_at_construction_in_0_1_0(plain):
    cfg, mesh, _ = plain
    model = wrap(tiny.tiny_transformer(cfg, mesh))
    inp = tiny.tiny_inputs(cfg)
    with tiny.mesh_context(cfg, mesh), pytest.raises(InvalidArgumentError) as e:
        model(inp["tokens"], inp["positions"], model_mode="autoregressive")
    assert "[model_mode]" in str(e.value) and "construct the module with model_mode='autoregressive'" in str(e.value)


# ----------------------------------------------------------------------------------------------
# Strict mode: a layer that drops or ignores the KV cache
# ----------------------------------------------------------------------------------------------


@pytest.mark.envs("maxtext-0.2.5")
def test_strict_mode_catches_the_scanned_llama_layer_dropping_the_cache(shim):
    """MaxText 0.2.5: LlamaDecoderLayer under scan_layers=True returns (y, None) to a kv_cache call."""
    cfg = tiny.tiny_config("default", vllm=True, scan_layers=True)
    mesh = _mesh(cfg)
    step = Step(cfg, 1)
    layer_cls = ROW.decoder_layers["llama2"].load()
    layer = wrap(layer_cls(config=cfg, model_mode="autoregressive", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1)))

    def run(m):
        return m(
            step.x,
            None,
            step.pos,
            True,
            "autoregressive",
            kv_cache=step.caches[0],
            attention_metadata=step.attention_metadata,
        )

    with tiny.mesh_context(cfg, mesh):
        _y, kv = nnx.jit(run)(layer)  # not strict: MaxText's own (silently wrong) answer
        assert kv is None
        with policy.strict_mode(), pytest.raises(KVCacheNotUpdatedError) as e:
            nnx.jit(run)(layer)
    assert "no KV cache" in str(e.value) and "scan-kv-carry-missing" in str(e.value)


@pytest.mark.envs(*KERNEL_ENVS)
@pytest.mark.parametrize("family", ["default", "qwen3", "gemma3"])
def test_strict_mode_catches_a_cache_returned_unchanged_in_each_family(vllm_model, family, mocker):
    """Fault injection: the attention returns the cache it was given (no write) -> strict mode raises."""
    cfg = tiny.tiny_config(family, vllm=NATIVE)
    mesh = _mesh(cfg)
    model = wrap(tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive" if NATIVE else None))
    step = Step(cfg, cfg.num_decoder_layers)
    if NATIVE:
        from helpers.serve_faults import replace_returned_cache

        replace_returned_cache(ROW.classes["attention"].load(), mocker, lambda given: given)
    else:
        from maxtext_compat.backport import attention as backport_attention

        def skip_write(session, op, query, key, value, sinks=None):
            _, cache = session.take()
            session.give(cache)
            return query

        mocker.patch.object(backport_attention, "attend", skip_write)
        mocker.patch("maxtext_compat.shims.backport_hooks.attend", skip_write)
    with tiny.mesh_context(cfg, mesh), policy.strict_mode(), pytest.raises(KVCacheNotUpdatedError) as e:
        nnx.jit(_transformer_step)(model, step.tokens, step.pos, list(step.caches), step.attention_metadata)
    assert "unchanged for layer 0" in str(e.value)
