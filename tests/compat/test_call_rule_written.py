"""The call rule follows what the caller wrote, never the values of the day.

A call that names `kv_cache` / `attention_metadata` (`kv_caches` for the Decoder and Transformer), even as
None, is a new-convention call and gets the new return; a call that names neither gets the old one. Batch 2
throughout: a bare result unpacked as `out, kv_cache = ...` would silently split the batch axis (found: the
rule used to be `kv is not None or md is not None`, so MaxText 0.2.x's own decoder layers, which pass
`kv_cache=None` in training, got a bare array from an adapted Attention). Values are compared with the native
call of the same module and weights, exactly (same program).
"""

from __future__ import annotations

import numpy as np
import pytest

# In maxtext-0.1.0-jax011 (the backport's serving stack) make test-extended's: maxtext-0.1.0 proves the release's calls.
pytestmark = [pytest.mark.needs_maxtext, pytest.mark.extended_in("maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")

from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
LEGACY = not ROW.has_kv_params
FAMILIES = {"default": "llama2", "qwen3": "qwen3", "gemma3": "gemma3"}
NONES = {"kv_cache": None, "attention_metadata": None}


def _equal(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _check(call, ours, native_out, *, new_tail=1):
    """Old call: a bare array equal to native. New call: a tuple ending in `new_tail` Nones."""
    if call == "old":
        assert isinstance(ours, jax.Array), type(ours)
        _equal(ours, native_out)
    else:
        assert isinstance(ours, tuple) and all(x is None for x in ours[-new_tail:]), ours
        _equal(ours[0], native_out)


@pytest.fixture(scope="module")
def default_model():
    cfg = tiny.tiny_config("default")
    return cfg, tiny.tiny_mesh(cfg)


# ----------------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------------


def _attention(m, x, pos, seg, extra):
    return m(x, x, pos, seg, model_mode="train", deterministic=True, **extra)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx.jit"])
@pytest.mark.parametrize("call", ["old", "new_none"])
def test_attention_return_follows_the_written_call(default_model, call, jit):
    cfg, mesh = default_model
    attn = tiny.tiny_attention(cfg, mesh)
    inp = tiny.tiny_inputs(cfg)
    assert inp["x"].shape[0] == 2
    extra = NONES if call == "new_none" else {}
    run = nnx.jit(_attention, static_argnums=4) if jit else _attention
    with tiny.mesh_context(cfg, mesh):
        native = run(attn, inp["x"], inp["positions"], inp["segment_ids"], _frozen(NONES if not LEGACY else {}))
        ours = run(wrap(attn), inp["x"], inp["positions"], inp["segment_ids"], _frozen(extra))
    _check(call, ours, native if LEGACY else native[0])


class _frozen(dict):
    """A hashable dict, so the keyword set can be a static argument of nnx.jit."""

    def __hash__(self):
        return hash(tuple(sorted(self)))


# ----------------------------------------------------------------------------------------------
# Decoder layers: NNX (0.2.x) or Linen init/apply (0.1.0), unscanned and scanned
# ----------------------------------------------------------------------------------------------


def _layer_kwargs(family, cfg, mesh):
    kw = {"config": cfg, "mesh": mesh, "name": "layers_0", "quant": None, "model_mode": "train"}
    if family == "gemma3":
        module = __import__(ROW.decoder_layers["gemma3"].module, fromlist=["x"])
        kw["attention_type"] = module.get_attention_type(layer_id=0)
    return kw


def _run_layer(family, cfg, mesh, call):
    """(native old-call result, adapter result for `call`) of one layer and its weights, train mode."""
    cls = ROW.decoder_layers[FAMILIES[family]].load()
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    seg = jnp.ones((2, 16), jnp.int32)
    extra = NONES if call == "new_none" else {}
    with tiny.mesh_context(cfg, mesh):
        if issubclass(cls, nn.Module):  # 0.1.0: Linen init/apply with the adapted subclass
            kw = _layer_kwargs(family, cfg, mesh)
            native, adapted = cls(**kw), wrap(cls)(**kw)
            key = jax.random.PRNGKey(1)
            v = jax.jit(lambda k: native.init({"params": k, "dropout": k, "aqt": k}, x, seg, pos, True, "train"))(key)
            n = jax.jit(lambda v: native.apply(v, x, seg, pos, True, "train"))(v)
            a = jax.jit(lambda v: adapted.apply(v, x, seg, pos, True, "train", **extra))(v)
            return n, a
        layer = cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)
        native = nnx.jit(lambda m, x: m(x, seg, pos, True, "train"))(layer, x)
        return native, nnx.jit(lambda m, x: m(x, seg, pos, True, "train", **extra))(wrap(layer), x)


@pytest.mark.parametrize("call", ["old", "new_none"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoder_layer_return_follows_the_written_call(family, call):
    cfg = tiny.tiny_config(family)
    native, ours = _run_layer(family, cfg, tiny.tiny_mesh(cfg), call)
    native_y = native[0] if isinstance(native, tuple) else native  # 0.1.0 default layer: (y, y); 0.2.x: (y, None)
    _check(call, ours, native_y)


@pytest.mark.parametrize("call", ["old", "new_none"])
def test_scanned_decoder_layer_returns_y_and_none_either_way(call):
    """A scanned layer's old return is already (y, None); a new call keeps that shape, never a bare y."""
    cfg = tiny.tiny_config("default", scan_layers=True)
    native, ours = _run_layer("default", cfg, tiny.tiny_mesh(cfg), call)
    assert isinstance(ours, tuple) and len(ours) == 2 and ours[1] is None
    _equal(ours[0], native[0] if isinstance(native, tuple) else native)


# ----------------------------------------------------------------------------------------------
# Decoder and Transformer
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformer(default_model):
    cfg, mesh = default_model
    return cfg, mesh, tiny.tiny_transformer(cfg, mesh)


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4")  # NNXDecoder unwrapped (0.2.3 wraps a Linen one in ToNNX)
@pytest.mark.parametrize("call", ["old", "new_none"])
def test_nnx_decoder_return_follows_the_written_call(transformer, call):
    cfg, mesh, model = transformer
    inp = tiny.tiny_inputs(cfg)
    extra = _frozen({"kv_caches": None, "attention_metadata": None} if call == "new_none" else {})

    def run(m, decoder, tokens, pos, seg, extra):
        return decoder(m.token_embedder, tokens, pos, decoder_segment_ids=seg, deterministic=True, model_mode="train",
                       **extra)  # fmt: skip

    step = nnx.jit(run, static_argnums=5)
    with tiny.mesh_context(cfg, mesh):
        native = step(model, model.decoder, inp["tokens"], inp["positions"], inp["segment_ids"], _frozen())
        ours = step(model, wrap(model.decoder), inp["tokens"], inp["positions"], inp["segment_ids"], extra)
    assert isinstance(ours, tuple) and len(ours) == (2 if call == "old" else 3)
    _equal(ours[0], native[0])
    _equal(ours[1], native[1])
    if call == "new_none":
        assert ours[2] is None


def _fwd(m, tokens, pos, seg, extra):
    return m(tokens, pos, decoder_segment_ids=seg, enable_dropout=False, **extra)


def test_transformer_new_call_is_a_tuple_or_a_typed_refusal(transformer):
    """0.2.x returns (hidden, kv_caches) only under a vLLM attention mode: elsewhere refused, never bare logits.

    On 0.1.0 the backport answers a new call with (hidden, None); its hidden state gives the native logits.
    """
    cfg, mesh, model = transformer
    inp = tiny.tiny_inputs(cfg)
    args = (inp["tokens"], inp["positions"], inp["segment_ids"])
    with tiny.mesh_context(cfg, mesh):
        native = nnx.jit(_fwd, static_argnums=4)(model, *args, _frozen())
        if not LEGACY:
            with pytest.raises(InvalidArgumentError, match="returns \\(hidden, kv_caches\\)") as e:
                _fwd(wrap(model), *args, {"kv_caches": None, "attention_metadata": None})
            assert e.value.argument == "config.attention" and "dot_product" in str(e.value)
            return
        hidden, kv = _fwd(wrap(model), *args, {"kv_caches": None, "attention_metadata": None})
        from maxtext_compat.convention.returns import logits_from_hidden

        logits = logits_from_hidden(model, hidden)
    assert kv is None
    np.testing.assert_allclose(np.asarray(logits), np.asarray(native), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# MaxText's own decoder layer, its Attention adapted
# ----------------------------------------------------------------------------------------------


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2", "maxtext-0.2.1", "maxtext-0.2.0")
def test_maxtexts_own_layer_with_its_attention_adapted_equals_native():
    """0.2.x layers call `attention_lnx, kv_cache = self.self_attention(..., kv_cache=None, ...)` in training."""
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    cls = ROW.decoder_layers["llama2"].load()
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    seg = jnp.ones((2, 16), jnp.int32)
    call = nnx.jit(lambda m, x: m(x, seg, pos, True, "train"))
    with tiny.mesh_context(cfg, mesh):
        layer = cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)
        native = call(layer, x)
        layer.self_attention = wrap(layer.self_attention)
        ours = call(layer, x)
    assert type(layer.self_attention).__name__.startswith("Compat")
    _equal(ours[0], native[0])


# ----------------------------------------------------------------------------------------------
# The vllm-backport shim (MaxText 0.1.0's own classes answer both conventions)
# ----------------------------------------------------------------------------------------------


@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011")
@pytest.mark.parametrize("call", ["old", "new_none"])
def test_shimmed_attention_and_layer_return_follows_the_written_call(default_model, call):
    from maxtext_compat import shims

    cfg, mesh = default_model
    inp = tiny.tiny_inputs(cfg)
    extra = _frozen(NONES if call == "new_none" else {})
    run = nnx.jit(_attention, static_argnums=4)
    with tiny.mesh_context(cfg, mesh):
        attn = tiny.tiny_attention(cfg, mesh)
        native = run(attn, inp["x"], inp["positions"], inp["segment_ids"], _frozen())
        shims.install("vllm-backport")
        try:
            jax.clear_caches()
            ours = run(attn, inp["x"], inp["positions"], inp["segment_ids"], extra)
        finally:
            shims.uninstall()
    _check(call, ours, native)
