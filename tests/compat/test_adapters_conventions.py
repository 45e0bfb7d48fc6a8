"""Adapters over the real MaxText of each environment: old calls, signatures, NNX/Linen usability.

Old call through the adapter == the native old call, bit for bit on 0.1.0, and == the `out`
part of the native call on 0.2.5. The new call's numerics live in test_adapters_new_call.py
and test_backport_numerics.py.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

# In maxtext-0.1.0-jax011 (the backport's serving stack) make test-extended's: maxtext-0.1.0 proves the release's calls.
pytestmark = [pytest.mark.needs_maxtext, pytest.mark.extended_in("maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")

from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
LEGACY = not ROW.has_kv_params
FAMILIES = ["default", "qwen3", "gemma3"]
LAYER_OF = {"default": "llama2", "qwen3": "qwen3", "gemma3": "gemma3"}


def supports_kw(fn, name: str) -> bool:
    """vLLM's `supports_kw`, as tpu-inference's model validation uses it."""
    params = inspect.signature(fn).parameters
    p = params.get(name)
    if p is not None:
        return p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params.values())


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    cfg = tiny.tiny_config(request.param)
    return request.param, cfg, tiny.tiny_mesh(cfg)


@pytest.fixture(scope="module")
def scanned_family():
    cfg = tiny.tiny_config("default", scan_layers=True)
    return cfg, tiny.tiny_mesh(cfg)


# ----------------------------------------------------------------------------------------------
# Signatures
# ----------------------------------------------------------------------------------------------


# Only the classes this release has (no Linen Decoder in 0.2.5, no NNXDecoder in 0.1.0).
@pytest.mark.parametrize("key", [k for k in ("attention", "transformer", "decoder", "nnx_decoder") if ROW.classes[k]])
def test_signature_shows_native_params_and_the_kv_params(key):
    cls = ROW.classes[key].load()
    adapted = wrap(cls)
    sig = inspect.signature(adapted.__call__)
    native = inspect.signature(cls.__call__)
    for name in native.parameters:
        assert name in sig.parameters, name
    kv = "kv_cache" if key == "attention" else "kv_caches"
    assert supports_kw(adapted.__call__, kv) and supports_kw(adapted.__call__, "attention_metadata")
    assert issubclass(adapted, cls)


@pytest.mark.parametrize("family_name", FAMILIES)
def test_decoder_layer_signature_binds_old_and_new_calls(family_name):
    cls = ROW.decoder_layers[LAYER_OF[family_name]].load()
    sig = inspect.signature(wrap(cls).__call__)
    old = sig.bind(object(), "x", "seg", "pos", True, "train")
    new = sig.bind(object(), "x", "seg", "pos", True, "autoregressive", kv_cache="c", attention_metadata="m")
    assert "kv_cache" not in old.arguments and new.arguments["kv_cache"] == "c"
    assert supports_kw(wrap(cls).__call__, "kv_cache")


def test_wrapping_is_cached_and_idempotent():
    cls = ROW.classes["attention"].load()
    assert wrap(cls) is wrap(cls)
    assert wrap(wrap(cls)) is wrap(cls)


# ----------------------------------------------------------------------------------------------
# Old calls == native
# ----------------------------------------------------------------------------------------------


def _attention_call(m, x, pos, seg):
    return m(x, x, pos, seg, model_mode="train", deterministic=True)


def test_attention_old_call_equals_native(family):
    _, cfg, mesh = family
    attn = tiny.tiny_attention(cfg, mesh)
    adapted = wrap(attn)
    inp = tiny.tiny_inputs(cfg)
    call = nnx.jit(_attention_call)
    with tiny.mesh_context(cfg, mesh):
        native = call(attn, inp["x"], inp["positions"], inp["segment_ids"])
        ours = call(adapted, inp["x"], inp["positions"], inp["segment_ids"])
    if LEGACY:
        assert isinstance(native, jax.Array)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(native))  # bit for bit
    else:
        assert isinstance(native, tuple) and native[1] is None
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(native[0]))
    assert isinstance(ours, jax.Array)


def _layer(family_name, cfg, mesh, cls):
    if issubclass(cls, nn.Module):
        kw = {"config": cfg, "mesh": mesh, "name": "layers_0", "quant": None, "model_mode": "train"}
        if family_name == "gemma3":
            kw["attention_type"] = __import__(ROW.decoder_layers["gemma3"].module, fromlist=["x"]).get_attention_type(
                layer_id=0
            )
        return kw
    return None


def _run_layer(family_name, cfg, mesh, cls):
    """(native result, adapter result) of the same layer and weights, old call in train mode."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    seg = jnp.ones((2, 16), jnp.int32)
    kw = _layer(family_name, cfg, mesh, cls)
    with tiny.mesh_context(cfg, mesh):
        if kw is not None:  # Linen (0.1.0): init/apply with the adapted subclass
            native, adapted = cls(**kw), wrap(cls)(**kw)
            key = jax.random.PRNGKey(1)
            v = jax.jit(lambda k: native.init({"params": k, "dropout": k, "aqt": k}, x, seg, pos, True, "train"))(key)
            v2 = jax.jit(lambda k: adapted.init({"params": k, "dropout": k, "aqt": k}, x, seg, pos, True, "train"))(key)
            assert jax.tree.structure(v) == jax.tree.structure(v2)  # the adapter's tree is the layer's own
            n = jax.jit(lambda v: native.apply(v, x, seg, pos, True, "train"))(v)
            a = jax.jit(lambda v: adapted.apply(v, x, seg, pos, True, "train"))(v)
            return n, a
        layer = cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)
        call = nnx.jit(lambda m, x: m(x, seg, pos, True, "train"))
        return call(layer, x), call(wrap(layer), x)


def test_decoder_layer_old_call_equals_native(family):
    name, cfg, mesh = family
    cls = ROW.decoder_layers[LAYER_OF[name]].load()
    native, ours = _run_layer(name, cfg, mesh, cls)
    if LEGACY:
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(native))
    else:
        assert isinstance(native, tuple) and native[1] is None
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(native[0]))
    assert isinstance(ours, jax.Array)


def test_scanned_decoder_layer_old_call_keeps_y_none(scanned_family):
    cfg, mesh = scanned_family
    cls = ROW.decoder_layers["llama2"].load()
    native, ours = _run_layer("default", cfg, mesh, cls)
    assert isinstance(ours, tuple) and len(ours) == 2 and ours[1] is None
    np.testing.assert_array_equal(np.asarray(ours[0]), np.asarray(native[0]))


@pytest.fixture(scope="module")
def transformers(family):
    name, cfg, mesh = family
    model = tiny.tiny_transformer(cfg, mesh)
    return name, cfg, mesh, model


def _fwd(m, tokens, pos, seg):
    return m(tokens, pos, decoder_segment_ids=seg, enable_dropout=False)


def test_transformer_old_call_equals_native_logits(transformers):
    _, cfg, mesh, model = transformers
    adapted = wrap(model)
    inp = tiny.tiny_inputs(cfg)
    call = nnx.jit(_fwd)
    with tiny.mesh_context(cfg, mesh):
        native = call(model, inp["tokens"], inp["positions"], inp["segment_ids"])
        ours = call(adapted, inp["tokens"], inp["positions"], inp["segment_ids"])
    assert isinstance(ours, jax.Array) and ours.shape == (*inp["tokens"].shape, cfg.vocab_size)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(native))


@pytest.mark.envs("maxtext-0.2.5")  # NNXDecoder; the 0.1.0 Linen Decoder is tested through TransformerLinenPure
def test_nnx_decoder_old_call_returns_logits_and_hidden(transformers):
    _, cfg, mesh, model = transformers
    inp = tiny.tiny_inputs(cfg)

    def call(m, decoder, tokens, pos, seg):
        return decoder(m.token_embedder, tokens, pos, decoder_segment_ids=seg, deterministic=True, model_mode="train")

    run = nnx.jit(call)
    with tiny.mesh_context(cfg, mesh):
        native = run(model, model.decoder, inp["tokens"], inp["positions"], inp["segment_ids"])
        ours = run(model, wrap(model.decoder), inp["tokens"], inp["positions"], inp["segment_ids"])
    assert len(native) == 3 and native[2] is None
    assert isinstance(ours, tuple) and len(ours) == 2
    np.testing.assert_array_equal(np.asarray(ours[0]), np.asarray(native[0]))
    np.testing.assert_array_equal(np.asarray(ours[1]), np.asarray(native[1]))


@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011")  # the Linen Decoder and TransformerLinenPure
def test_linen_decoder_and_transformer_in_init_apply(monkeypatch):
    """0.1.0: the adapted Linen Decoder inside MaxText's own TransformerLinenPure, through init/apply."""
    from MaxText.layers import decoders, models

    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    native = models.transformer_as_linen(cfg, mesh, quant=None, model_mode="train")
    args = (inp["tokens"], inp["positions"])
    kw = {"decoder_segment_ids": inp["segment_ids"], "enable_dropout": False}
    key = jax.random.PRNGKey(0)

    def decoder_call(m):  # the Decoder called directly, inside the Transformer's scope
        return m.decoder(m.shared_embedding, inp["tokens"], inp["positions"], inp["segment_ids"], True)

    with tiny.mesh_context(cfg, mesh):
        variables = jax.jit(lambda k: native.init({"params": k, "dropout": k, "aqt": k}, *args, **kw))(key)
        want_logits = jax.jit(lambda v: native.apply(v, *args, **kw, rngs={"aqt": key}))(variables)
        want_dec = jax.jit(lambda v: native.apply(v, method=decoder_call, rngs={"aqt": key}))(variables)
        monkeypatch.setattr(models, "Decoder", wrap(decoders.Decoder))
        adapted = wrap(models.transformer_as_linen(cfg, mesh, quant=None, model_mode="train"))
        got_logits = jax.jit(lambda v: adapted.apply(v, *args, **kw, rngs={"aqt": key}))(variables)
        got_dec = jax.jit(lambda v: adapted.apply(v, method=decoder_call, rngs={"aqt": key}))(variables)
    np.testing.assert_array_equal(np.asarray(got_logits), np.asarray(want_logits))
    assert type(got_dec) is tuple and len(got_dec) == 2
    for a, b in zip(got_dec, want_dec, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------------------------
# Wherever the wrapped module is usable
# ----------------------------------------------------------------------------------------------


def test_nnx_adapter_shares_parameters_and_survives_split_merge_and_submodules(family):
    _, cfg, mesh = family
    attn = tiny.tiny_attention(cfg, mesh)
    adapted = wrap(attn)
    theirs = jax.tree.leaves(nnx.state(attn, nnx.Param))
    ours = jax.tree.leaves(nnx.state(adapted, nnx.Param))
    assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs, strict=True))
    assert isinstance(adapted, type(attn))

    graphdef, state = nnx.split(adapted)
    merged = nnx.merge(graphdef, state)
    assert type(merged) is type(adapted)

    class Host(nnx.Module):
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, x, pos, seg):
            return self.inner(x, x, pos, seg, model_mode="train", deterministic=True)

    host = Host(adapted)
    inp = tiny.tiny_inputs(cfg)
    with tiny.mesh_context(cfg, mesh):
        out = nnx.jit(lambda h, x, p, s: h(x, p, s))(host, inp["x"], inp["positions"], inp["segment_ids"])
        direct = nnx.jit(_attention_call)(merged, inp["x"], inp["positions"], inp["segment_ids"])
    np.testing.assert_array_equal(np.asarray(out), np.asarray(direct))

    # an update through the adapter is an update of the wrapped module's parameters
    bumped = jax.tree.map(lambda a: a + 1.0, nnx.state(adapted, nnx.Param))
    nnx.update(adapted, bumped)
    kernel = nnx.state(attn, nnx.Param)["query"]["kernel"]
    np.testing.assert_array_equal(np.asarray(kernel[...]), np.asarray(bumped["query"]["kernel"][...]))


def test_attention_old_calls_in_prefill_then_autoregressive_mode_equal_native():
    """MaxText's own KV cache (prefill, then one decode step) through the adapter: same numbers."""
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    b, seq = 2, 32

    def make():
        return tiny.tiny_attention(cfg, mesh, model_mode="autoregressive", batch=b, seq=seq)

    native, adapted = make(), wrap(make())
    x = jax.random.normal(jax.random.PRNGKey(0), (b, seq, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (b, seq))
    x1 = jax.random.normal(jax.random.PRNGKey(1), (b, 1, cfg.emb_dim))
    pos1 = jnp.full((b, 1), seq, jnp.int32)
    prefill = nnx.jit(
        lambda m, x, p: m(x, x, p, jnp.ones(p.shape, jnp.int32), model_mode="prefill", deterministic=True)
    )
    decode = nnx.jit(lambda m, x, p: m(x, x, p, None, model_mode="autoregressive", deterministic=True))
    with tiny.mesh_context(cfg, mesh):
        for step, args in ((prefill, (x, pos)), (decode, (x1, pos1))):
            want, got = step(native, *args), step(adapted, *args)
            want = want[0] if isinstance(want, tuple) else want
            assert isinstance(got, jax.Array)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
