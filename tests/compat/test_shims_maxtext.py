"""MaxText shim profiles on real installs: vllm-backport (0.1.0) and known-defects (0.2.5).

- vllm-backport gives MaxText 0.1.0's own classes the call rule: MaxText's own Transformer
  takes kv_caches / attention_metadata and runs ragged paged attention, while every old call
  (training included) keeps its result bit for bit; uninstall restores every original.
- known-defects: the KV caches MaxText 0.2.5 drops under scan_layers=True, shown natively and
  fixed by the shim.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

# In maxtext-0.1.0-jax011 (the backport's serving stack) make test-extended's: maxtext-0.1.0 proves the release's calls.
pytestmark = [pytest.mark.needs_maxtext, pytest.mark.extended_in("maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from maxtext_compat import paged, shims  # noqa: E402
from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.shims import defect_patches, maxtext_profiles  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
KERNEL = os.environ.get("MAXTEXT_COMPAT_ENV") in ("maxtext-0.2.5", "maxtext-0.1.0-jax011")
LEGACY_ENVS = ("maxtext-0.1.0", "maxtext-0.1.0-jax011")


@pytest.fixture(autouse=True)
def clean():
    shims.uninstall()
    maxtext_profiles.register()  # the unit tests may have cleared the default chooser
    yield
    shims.uninstall()


@pytest.fixture
def kernel_shim():  # per test: `clean` (autouse, so first) removes every shim, the CPU kernel stand-in too
    if not KERNEL:
        return None
    from maxtext_compat.cpu import rpa as cpu_rpa

    return cpu_rpa.install()


def _originals():
    out = {}
    for ref in [*[r for r in ROW.classes.values() if r], *ROW.decoder_layers.values()]:
        cls = ref.load()
        out[str(ref)] = (cls, dict(vars(cls)))
    return out


def _step(cfg, layers):
    layout = paged.KVCacheLayout(8, 16, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(8, 16)
    seqs = [paged.SequenceSlice(n, n, alloc.allocate(s, n), s) for s, n in (("A", 20), ("C", 13))]
    md = paged.build_metadata(seqs, layout, max_num_tokens=40, max_num_seqs=4, pages_per_seq=2)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (40, 1)).astype(np.int32))
    pos = jnp.asarray(md.to_kernel_order(np.concatenate([np.arange(20), np.arange(13)]).astype(np.int32)))[:, None]
    return layout.allocate(layers), tokens, pos, md


def _new_call(m, tokens, pos, kvs, md):
    return m(tokens, pos, kv_caches=kvs, attention_metadata=md, model_mode="autoregressive")


@pytest.mark.envs(*LEGACY_ENVS)
def test_default_profile_is_the_backport_and_uninstall_restores_identity():
    before = _originals()
    assert maxtext_profiles.choose(__import__("maxtext_compat").resolve(probe=False)) == "vllm-backport"
    patch_set = shims.install()
    assert shims.installed("vllm-backport") and shims.install() is patch_set  # idempotent
    transformer = ROW.classes["transformer"].load()
    params = inspect.signature(transformer.__call__).parameters
    assert "kv_caches" in params and "attention_metadata" in params
    from maxtext_compat import doctor

    listed = {p["target"]: p for p in doctor.collect()["active_patches"]}
    assert f"{ROW.classes['transformer']}.__call__" in listed
    assert listed[f"{ROW.classes['transformer']}.__call__"]["profile"] == "vllm-backport"
    assert "_rule_factory" in listed[f"{ROW.classes['transformer']}.__call__"]["origin"]
    shims.uninstall()
    for _, (cls, attrs) in before.items():
        for name, value in attrs.items():
            assert vars(cls).get(name) is value, (cls, name)
        assert set(vars(cls)) == set(attrs)


@pytest.mark.envs(*LEGACY_ENVS)
def test_training_is_unchanged_with_the_backport_installed():
    """Loss and gradients of 0.1.0's Linen Transformer, with and without the shim: bit for bit."""
    from MaxText.layers import models

    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    key = jax.random.PRNGKey(0)

    def build_and_grad():
        model = models.transformer_as_linen(cfg, mesh, quant=None, model_mode="train")
        kw = {"decoder_segment_ids": inp["segment_ids"], "enable_dropout": False}

        def loss(params):
            logits = model.apply({"params": params}, inp["tokens"], inp["positions"], **kw, rngs={"aqt": key})
            onehot = jax.nn.one_hot(inp["tokens"], cfg.vocab_size)
            return -(jax.nn.log_softmax(logits) * onehot).sum(-1).mean()

        with tiny.mesh_context(cfg, mesh):
            variables = jax.jit(
                lambda k: model.init({"params": k, "dropout": k, "aqt": k}, inp["tokens"], inp["positions"], **kw)
            )(key)
            return jax.jit(jax.value_and_grad(loss))(variables["params"])

    want = build_and_grad()
    shims.install("vllm-backport")
    jax.clear_caches()  # trace again, through the patched classes
    got = build_and_grad()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.envs(*LEGACY_ENVS)
def test_vllm_rpa_config_is_accepted_only_with_the_shim():
    with pytest.raises(ValueError, match="Invalid attention kernel"):
        tiny.tiny_config("default", attention="vllm_rpa")
    shims.install("vllm-backport")
    cfg = tiny.tiny_config("default", attention="vllm_rpa")
    assert cfg.attention == "vllm_rpa"
    plain_cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    model, plain = tiny.tiny_transformer(cfg, mesh), tiny.tiny_transformer(plain_cfg, mesh)
    inp = tiny.tiny_inputs(cfg)
    call = nnx.jit(lambda m, t, p, s: m(t, p, decoder_segment_ids=s, enable_dropout=False))
    with tiny.mesh_context(cfg, mesh):
        got = call(model, inp["tokens"], inp["positions"], inp["segment_ids"])  # train mode: MaxText's dot product
        want = call(plain, inp["tokens"], inp["positions"], inp["segment_ids"])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.envs("maxtext-0.1.0-jax011")
def test_maxtext_own_transformer_takes_the_new_call_with_the_shim(kernel_shim):
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    model = tiny.tiny_transformer(cfg, mesh)
    kvs, tokens, pos, md = _step(cfg, cfg.num_decoder_layers)
    run = nnx.jit(_new_call)
    with tiny.mesh_context(cfg, mesh):
        want_hidden, want_kvs = run(wrap(model), tokens, pos, list(kvs), md.to_attention_metadata())
        shims.install("vllm-backport")
        jax.clear_caches()
        hidden, got_kvs = run(model, tokens, pos, list(kvs), md.to_attention_metadata())  # MaxText's own class
    np.testing.assert_array_equal(np.asarray(hidden), np.asarray(want_hidden))
    for a, b in zip(got_kvs, want_kvs, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert float(jnp.abs(a).sum()) > 0


@pytest.mark.envs("maxtext-0.2.5")
def test_scanned_kv_drop_is_shown_natively_and_fixed_by_the_shim(kernel_shim):
    from jax.sharding import Mesh

    from maxtext_compat.convention.returns import logits_from_hidden

    cfg = tiny.tiny_config("default", vllm=True, scan_layers=True)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
    model = tiny.tiny_transformer(cfg, mesh, model_mode="autoregressive")
    kvs, tokens, pos, md = _step(cfg, cfg.num_decoder_layers)
    run = nnx.jit(_new_call)
    logits = nnx.jit(lambda m, h: logits_from_hidden(m, h, "autoregressive"))
    train = nnx.jit(lambda m, t, p: m(t, p, decoder_segment_ids=None, enable_dropout=False, model_mode="train")[0])
    with tiny.mesh_context(cfg, mesh):
        _, native_kvs = run(model, tokens, pos, list(kvs), md.to_attention_metadata())
        assert all(kv is None for kv in native_kvs)  # the defect: every cache dropped
        assert shims.install() is not None and shims.installed("known-defects")  # the matrix picks the fix
        jax.clear_caches()  # a patch changes new traces only: the native trace above is cached
        hidden, fixed_kvs = run(model, tokens, pos, list(kvs), md.to_attention_metadata())
        got = logits(model, hidden)
        # the same tokens per sequence through MaxText's own dense path (train mode, causal)
        order = np.asarray(md.from_kernel_order(np.asarray(tokens)[:, 0]))
        seq_a, seq_c = order[:20], order[20:33]
        ref_a = logits(model, train(model, jnp.asarray(seq_a)[None], jnp.arange(20, dtype=jnp.int32)[None]))
        ref_c = logits(model, train(model, jnp.asarray(seq_c)[None], jnp.arange(13, dtype=jnp.int32)[None]))
    assert all(kv is not None and float(jnp.abs(kv).sum()) > 0 for kv in fixed_kvs)
    got = md.from_kernel_order(np.asarray(got)[:, 0])
    np.testing.assert_allclose(got[:20], np.asarray(ref_a)[0], atol=1e-4, rtol=0)  # measured ~2e-6
    np.testing.assert_allclose(got[20:33], np.asarray(ref_c)[0], atol=1e-4, rtol=0)


@pytest.mark.envs("maxtext-0.2.5")
@pytest.mark.parametrize("scanned", [True, False])
def test_scan_carry_fix_for_the_linen_releases(scanned):
    """0.2.2–0.2.4's generic layer ignores the (y, stacked_kv, idx) carry; a stand-in layer shows the fix.

    Why a stand-in: on flax 0.12.10, MaxText 0.2.3's own scanned Linen decoder does not trace with
    kv_caches at all ("broadcasted variable has a data dependency on the scan body", natively and
    with the shim), so the carry never reaches a real layer through the model.
    """

    class Config:
        scan_layers = scanned

    class GenericLayer:  # what 0.2.2–0.2.4's generic DecoderLayer does with a carry: nothing useful
        config = Config()

        def __call__(self, inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode,
                     previous_chunk=None, slot=None, kv_cache=None, attention_metadata=None):  # fmt: skip
            if isinstance(inputs, tuple):
                raise TypeError("a tuple reached the layer body")  # MaxText would fail further down
            new_kv = None if kv_cache is None else kv_cache + 1.0
            return (inputs * 2.0, None) if self.config.scan_layers else (inputs * 2.0, new_kv)

    class Original:
        function = GenericLayer.__call__

    wrapper = defect_patches._scan_kv_fix(Original)
    layer = GenericLayer()
    stacked = jnp.zeros((3, 4))
    carry = (jnp.ones((2,)), stacked, 1)

    def call(*args, **kwargs):
        return wrapper(lambda *a, **k: GenericLayer.__call__(layer, *a, **k), layer, args, kwargs)

    if scanned:
        (y, new_stacked, idx), none = call(carry, None, None, True, "autoregressive", attention_metadata="md")
        assert none is None and idx == 2
        np.testing.assert_array_equal(np.asarray(y), [2.0, 2.0])
        np.testing.assert_array_equal(np.asarray(new_stacked[1]), np.ones(4))  # the layer's cache written back
        np.testing.assert_array_equal(np.asarray(new_stacked[0]), np.zeros(4))
        y, kv = call(jnp.ones((2,)), None, None, True, "autoregressive", kv_cache=jnp.zeros(4))
        np.testing.assert_array_equal(np.asarray(kv), np.ones(4))  # the unroll path: (y, kv) instead of (y, None)
        assert layer.config.scan_layers  # the config view was temporary
    else:
        y, kv = call(jnp.ones((2,)), None, None, True, "autoregressive", kv_cache=jnp.zeros(4))
        np.testing.assert_array_equal(np.asarray(kv), np.ones(4))


@pytest.mark.envs("maxtext-0.1.0-jax011")
def test_linen_apply_of_a_patched_layer_takes_the_new_call(kernel_shim):
    """Flax's apply() unbinds `__call__` through `__func__`: the patch must stay on that path."""
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    layer_cls = ROW.decoder_layers["llama2"].load()
    kvs, _, pos, md = _step(cfg, 1)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((40, 1, cfg.emb_dim)).astype(np.float32))
    shims.install("vllm-backport")
    layer = layer_cls(config=cfg, mesh=mesh, name="layers_0", quant=None, model_mode="train")
    key = jax.random.PRNGKey(0)
    with tiny.mesh_context(cfg, mesh):
        variables = jax.jit(lambda k: layer.init({"params": k, "dropout": k, "aqt": k}, x, None, pos, True, "train"))(
            key
        )
        old = jax.jit(lambda v: layer.apply(v, x, None, pos, True, "train"))(variables)
        y, kv = jax.jit(
            lambda v, c, m: layer.apply(v, x, None, pos, True, "autoregressive", kv_cache=c, attention_metadata=m)
        )(variables, kvs[0], md.to_attention_metadata())
    assert isinstance(old, jax.Array) and y.shape == old.shape
    assert float(jnp.abs(kv).sum()) > 0  # the paged cache was written through Linen's apply path


@pytest.mark.envs("maxtext-0.2.5")
def test_scan_kv_fix_never_changes_the_shared_layer():
    """Found: the fix swapped `module.config` during the call, so another thread calling the same NNX layer saw
    scan_layers=False (or, once restored mid-call, lost its KV cache). Now the call runs on a twin."""
    import types

    class Layer(nnx.Module):
        def __init__(self):
            self.config = types.SimpleNamespace(scan_layers=True)

        def __call__(self, x):
            seen.append((self.config.scan_layers, shared.config.scan_layers))  # the call's view, another thread's
            return x, "kv"

    seen: list[tuple[bool, bool]] = []
    shared = Layer()
    config = shared.config
    out = defect_patches._call_unscanned(Layer.__call__, shared.__call__, shared, (1,), {})
    assert out == (1, "kv") and seen == [(False, True)] and shared.config is config
