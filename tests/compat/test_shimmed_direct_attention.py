"""A direct new call of MaxText 0.1.0's own Attention under the vllm-backport shim takes the backport path.

Found by running MaxText's later tests on 0.1.0 with `shims.install()`: the top-level new call of a shimmed
Attention ran MaxText 0.1.0's own KV-cache update (with `(1, T, E)` inputs: MaxText's "Sequence length
should be 1 during autoregression"; with `(T, 1, E)`: a result, but MaxText's own cache variables changed).
Now it behaves exactly like `adapters.wrap()` on 0.1.0, in both input layouts MaxText 0.2.x accepts: outputs
and KV caches equal element for element, MaxText's own cache variables untouched, eager and under nnx.jit,
at the Attention, decoder-layer and Transformer level. `attention="vllm_batched_rpa"` is a typed refusal.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from maxtext_compat import paged, shims  # noqa: E402
from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.errors import ShimRefusedError  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

PAGES, PAGE, TOKENS = 8, 16, 40
LENGTHS = {"A": 20, "C": 13}


@pytest.fixture(scope="module")
def kernel():
    from maxtext_compat.cpu import rpa as cpu_rpa

    status = cpu_rpa.install()
    assert status.active, status.reason
    return status


@pytest.fixture(scope="module")
def setup(kernel):
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    layout = paged.KVCacheLayout(PAGES, PAGE, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(PAGES, PAGE)
    seqs = [paged.SequenceSlice(n, n, alloc.allocate(s, n), s) for s, n in LENGTHS.items()]
    md = paged.build_metadata(seqs, layout, max_num_tokens=TOKENS, max_num_seqs=4, pages_per_seq=2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((TOKENS, cfg.emb_dim)).astype(np.float32)
    tokens = rng.integers(0, cfg.vocab_size, (TOKENS,)).astype(np.int32)
    pos = md.to_kernel_order(np.concatenate([np.arange(n) for n in LENGTHS.values()]).astype(np.int32))
    return cfg, mesh, layout, md, x, tokens, np.asarray(pos)


@pytest.fixture(autouse=True)
def _builtin_profiles():
    """MaxText's profiles and default chooser (unit tests before this module may have cleared them)."""
    from maxtext_compat.shims import maxtext_profiles

    maxtext_profiles.register()


def _shape(a, layout_name):
    """(T, 1, ...) tokens first, or (1, T, ...) one batch row of T tokens: both are accepted by MaxText 0.2.x."""
    a = jnp.asarray(a)
    return a[:, None] if layout_name == "tokens_first" else a[None, :]


def _attention_step(m, x, pos, kv, md):
    return m(x, x, pos, None, model_mode="autoregressive", deterministic=True, kv_cache=kv, attention_metadata=md)


def _not_params(module):
    """MaxText's own variables besides weights and RNG streams: its KV-cache variables in autoregressive mode."""
    state = nnx.state(module, nnx.Not(nnx.Any(nnx.Param, nnx.RngState)))
    leaves = jax.tree.leaves(state)
    assert leaves, "an autoregressive MaxText Attention has cache variables"
    return jax.tree.map(np.asarray, state)


def _assert_same_state(before, after):
    leaves_b, tree_b = jax.tree.flatten(before)
    leaves_a, tree_a = jax.tree.flatten(after)
    assert tree_b == tree_a
    for b, a in zip(leaves_b, leaves_a, strict=True):
        np.testing.assert_array_equal(a, b)


def _equal(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _without_backport_hooks():
    """The adapter installs the context-gated backport hooks on first use and leaves them: remove them, so
    the shimmed call is seen as a user of MaxText 0.1.0 with only `shims.install()` would see it."""
    from maxtext_compat.shims import backport_hooks as hooks

    if hooks.PROFILE in shims.registered_profiles():
        shims.uninstall(hooks.PROFILE)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx.jit"])
@pytest.mark.parametrize("layout_name", ["tokens_first", "batch_first"])
def test_direct_new_call_on_shimmed_attention_equals_the_adapter(setup, layout_name, jit):
    cfg, mesh, layout, md, x, _, pos = setup
    batch, seq = (TOKENS, 1) if layout_name == "tokens_first" else (1, TOKENS)
    xs, ps = _shape(x, layout_name), _shape(pos, layout_name)
    am = md.to_attention_metadata()
    run = nnx.jit(_attention_step) if jit else _attention_step
    with tiny.mesh_context(cfg, mesh):
        _without_backport_hooks()
        attn = tiny.tiny_attention(cfg, mesh, model_mode="autoregressive", batch=batch, seq=seq)
        before = _not_params(attn)
        with shims.patched("vllm-backport"):
            out, kv = run(attn, xs, ps, layout.allocate(1)[0], am)
        adapted = wrap(tiny.tiny_attention(cfg, mesh, model_mode="autoregressive", batch=batch, seq=seq))  # same seed
        want_out, want_kv = run(adapted, xs, ps, layout.allocate(1)[0], am)
    assert out.shape == xs.shape
    _equal(out, want_out)
    _equal(kv, want_kv)
    assert np.abs(np.asarray(kv)).max() > 0  # the step wrote the paged cache
    _assert_same_state(before, _not_params(attn))  # MaxText's own KV-cache variables untouched


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx.jit"])
def test_direct_new_call_on_shimmed_transformer_equals_the_adapter(setup, jit):
    cfg, mesh, layout, md, _, tokens, pos = setup
    am = md.to_attention_metadata()

    def step(m, tok, p, kvs, md):
        return m(tok, p, kv_caches=kvs, attention_metadata=md, model_mode="autoregressive")

    run = nnx.jit(step) if jit else step
    tok, p = jnp.asarray(tokens)[:, None], jnp.asarray(pos)[:, None]
    with tiny.mesh_context(cfg, mesh):
        _without_backport_hooks()
        model = tiny.tiny_transformer(cfg, mesh)
        with shims.patched("vllm-backport"):
            hidden, kvs = run(model, tok, p, layout.allocate(cfg.num_decoder_layers), am)
        want_hidden, want_kvs = run(wrap(model), tok, p, layout.allocate(cfg.num_decoder_layers), am)
    _equal(hidden, want_hidden)
    assert len(kvs) == len(want_kvs) == cfg.num_decoder_layers
    for a, b in zip(kvs, want_kvs, strict=True):
        _equal(a, b)


def test_batched_rpa_mode_is_a_typed_refusal_naming_the_alternative():
    with shims.patched("vllm-backport"), pytest.raises(ShimRefusedError) as e:
        tiny.tiny_config("default", attention="vllm_batched_rpa")
    assert e.value.argument == "attention"
    assert "'vllm_rpa'" in str(e.value) and "0.1.0" in str(e.value) and "0.2.4" in str(e.value)


@pytest.mark.parametrize("layout_name", ["tokens_first", "batch_first"])
def test_direct_new_call_on_a_shimmed_linen_decoder_layer_equals_the_adapter(setup, layout_name):
    cfg, mesh, layout, md, x, _, pos = setup
    cls = tiny.installed_row().decoder_layers["llama2"].load()
    kw = {"config": cfg, "mesh": mesh, "name": "layers_0", "quant": None, "model_mode": "autoregressive"}
    xs, ps = _shape(x, layout_name), _shape(pos, layout_name)
    am = md.to_attention_metadata()

    def step(module, v, kv):
        return module.apply(v, xs, None, ps, True, "autoregressive", kv_cache=kv, attention_metadata=am)

    with tiny.mesh_context(cfg, mesh):
        _without_backport_hooks()
        key = jax.random.PRNGKey(1)
        train = cls(**{**kw, "model_mode": "train"})
        v = jax.jit(lambda k: train.init({"params": k, "dropout": k, "aqt": k}, xs, None, ps, True, "train"))(key)
        with shims.patched("vllm-backport"):
            y, kv = jax.jit(lambda v, kv: step(cls(**kw), v, kv))(v, layout.allocate(1)[0])
        want_y, want_kv = jax.jit(lambda v, kv: step(wrap(cls)(**kw), v, kv))(v, layout.allocate(1)[0])
    assert y.shape == xs.shape
    _equal(y, want_y)
    _equal(kv, want_kv)
    assert np.abs(np.asarray(kv)).max() > 0
