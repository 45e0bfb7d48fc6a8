"""MaxText 0.1.0's Linen `Decoder`, called directly, under a declared `kv_return` convention.

Code written after MaxText PR #2616 unpacks `logits, hidden, kv_caches = decoder(...)` on every call. On 0.1.0
(whose Decoder returns `(logits, hidden)` and takes no KV argument) `shims.install(convention="kv_return")`
must give it that 3-tuple in every model_mode:
* with MaxText's own contiguous KV cache (train, prefill, then autoregressive steps, `mutable=["cache"]`):
  logits, hidden and every cache variable equal to the native call, exactly (same program), `None` as
  kv_caches because none was passed;
* with the paged cache (the vllm-backport path, a ragged batch of two prompts): oracles that do not use the
  shim -- each prompt's logits against the native prefill pass of that prompt alone (measured max |diff|
  1.9e-6; tolerance 1e-5), and each layer's K/V pages read back against MaxText's own prefill cache of that
  prompt (measured <= 1.8e-6; tolerance 1e-5).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011"),
    # make test-extended's in the backport's serving stack: maxtext-0.1.0 proves the release's calls
    pytest.mark.extended_in("maxtext-0.1.0-jax011"),
]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from maxtext_compat import paged, shims  # noqa: E402
from maxtext_compat.convention.callers import set_caller_convention  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

AR_STEPS = 3
LENGTHS = {"A": 20, "C": 13}  # the second prompt crosses no page, the first does (page size 16)
PAGES, PAGE, TOKENS = 8, 16, 40
TOL = 1e-5


@pytest.fixture(autouse=True)
def _builtin_profiles():
    """MaxText's profiles and default chooser (unit tests before this module may have cleared them)."""
    from maxtext_compat.shims import maxtext_profiles

    maxtext_profiles.register()


@pytest.fixture(scope="module")
def model():
    """A tiny Llama-style TransformerLinenPure (holds the Linen Decoder) and its train-mode variables."""
    from MaxText.layers import models

    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    m = models.transformer_as_linen(cfg, mesh, quant=None, model_mode="train")
    key = jax.random.PRNGKey(0)
    args = (inp["tokens"], inp["positions"])
    kw = {"decoder_segment_ids": inp["segment_ids"], "enable_dropout": False}
    with tiny.mesh_context(cfg, mesh):
        variables = jax.jit(lambda k: m.init({"params": k, "dropout": k, "aqt": k}, *args, **kw))(key)
    return cfg, mesh, m, variables, inp


def _decoder(module, tokens, positions, segment_ids, **new):
    """The Decoder called directly inside the Transformer's scope (MaxText's own arguments, positional)."""
    return module.decoder(module.shared_embedding, tokens, positions, segment_ids, True, **new)


def _apply(m, variables, *args, mode, mutable=False, **new):
    key = jax.random.PRNGKey(0)
    return m.apply(variables, *args, method=_decoder, model_mode=mode, mutable=mutable, rngs={"aqt": key}, **new)


class _declared:
    """`shims.install(convention="kv_return")` for the block; everything it brought is taken away after."""

    def __enter__(self):
        self.before = shims.active_profiles()
        shims.install(convention="kv_return")
        assert "vllm-backport" in shims.active_profiles()
        jax.clear_caches()

    def __exit__(self, *exc):
        for name in reversed(shims.active_profiles()):
            if name not in self.before:
                shims.uninstall(name)
        set_caller_convention(None)
        jax.clear_caches()


def _equal(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _equal_trees(a, b):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    assert leaves_a, "the cache collection holds MaxText's KV-cache variables"
    for x, y in zip(leaves_a, leaves_b, strict=True):
        _equal(x, y)


def _run_modes(cfg, mesh, m, variables, inp):
    """Train, prefill (mutable cache), then AR_STEPS autoregressive steps: (results, cache collections)."""
    tokens, positions, seg = inp["tokens"], inp["positions"], inp["segment_ids"]
    with tiny.mesh_context(cfg, mesh):
        train = _apply(m, variables, tokens, positions, seg, mode="train")
        prefill, prefill_cache = _apply(m, variables, tokens, positions, seg, mode="prefill", mutable=["cache"])
        key = jax.random.PRNGKey(0)
        cache = m.init({"params": key, "dropout": key, "aqt": key}, tokens[:, :1], positions[:, :1],
                       enable_dropout=False, model_mode="autoregressive")["cache"]  # fmt: skip
        steps = []
        for i in range(AR_STEPS):
            out, updated = _apply(m, {"params": variables["params"], "cache": cache}, tokens[:, i : i + 1],
                                  positions[:, i : i + 1], None, mode="autoregressive", mutable=["cache"])  # fmt: skip
            cache = updated["cache"]
            steps.append(out)
    return (train, prefill, *steps), (prefill_cache, cache)


def test_kv_return_gives_three_in_every_model_mode_with_maxtexts_own_cache(model):
    cfg, mesh, m, variables, inp = model
    native, native_caches = _run_modes(cfg, mesh, m, variables, inp)
    with _declared():
        ours, our_caches = _run_modes(cfg, mesh, m, variables, inp)
    for got, want in zip(ours, native, strict=True):
        assert type(want) is tuple and len(want) == 2  # MaxText 0.1.0's own return
        assert type(got) is tuple and len(got) == 3 and got[2] is None  # no cache passed: None, as 0.2.x returns
        _equal(got[0], want[0])
        _equal(got[1], want[1])
    for got, want in zip(our_caches, native_caches, strict=True):
        _equal_trees(got, want)


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("tpu_inference", reason="the paged path needs tpu-inference's kernel")
    from maxtext_compat.cpu import rpa as cpu_rpa

    status = cpu_rpa.install()
    assert status.active, status.reason
    return status


@pytest.mark.envs("maxtext-0.1.0-jax011")  # the environment with tpu-inference (the RPA kernel)
def test_kv_return_paged_call_returns_logits_hidden_and_the_written_caches(model, kernel):
    cfg, mesh, m, variables, _ = model
    layout = paged.KVCacheLayout(PAGES, PAGE, cfg.num_kv_heads, cfg.head_dim, "float32")
    alloc = paged.PageAllocator(PAGES, PAGE)
    seqs = [paged.SequenceSlice(n, n, alloc.allocate(s, n), s) for s, n in LENGTHS.items()]
    md = paged.build_metadata(seqs, layout, max_num_tokens=TOKENS, max_num_seqs=4, pages_per_seq=2)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, n).astype(np.int32) for n in LENGTHS.values()]
    tokens = md.to_kernel_order(np.concatenate(prompts))
    positions = md.to_kernel_order(np.concatenate([np.arange(n, dtype=np.int32) for n in LENGTHS.values()]))
    with tiny.mesh_context(cfg, mesh):
        with _declared():
            result = _apply(m, variables, jnp.asarray(tokens)[:, None], jnp.asarray(positions)[:, None], None,
                            mode="autoregressive", kv_caches=layout.allocate(cfg.num_decoder_layers),
                            attention_metadata=md.to_attention_metadata())  # fmt: skip
        assert type(result) is tuple and len(result) == 3
        logits, hidden, kv_caches = result
        assert logits.shape == (TOKENS, 1, cfg.vocab_size) and hidden.shape == (TOKENS, 1, cfg.emb_dim)
        assert isinstance(kv_caches, list) and len(kv_caches) == cfg.num_decoder_layers
        rows = md.from_kernel_order(np.asarray(logits)[:, 0])
        start = 0
        for i, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True)):
            n = len(prompt)
            one = (jnp.asarray(prompt)[None], jnp.arange(n, dtype=jnp.int32)[None], jnp.ones((1, n), jnp.int32))
            (want_logits, _), cache = _apply(m, variables, *one, mode="prefill", mutable=["cache"])
            np.testing.assert_allclose(rows[start : start + n], np.asarray(want_logits)[0], rtol=TOL, atol=TOL)
            start += n
            for layer, kv in enumerate(kv_caches):
                own = cache["cache"]["decoder"][f"layers_{layer}"]["self_attention"]["KVCache_0"]
                k, v = paged.read_kv(kv, layout, seq.pages, n)
                # MaxText's prefill cache is stored as (length, kv_heads, batch, head_dim) (axis order 1,2,0,3)
                want_k = np.asarray(own["cached_prefill_key"])[:, :, 0]
                want_v = np.asarray(own["cached_prefill_value"])[:, :, 0]
                np.testing.assert_allclose(k, want_k, rtol=TOL, atol=TOL, err_msg=f"K layer {layer} seq {i}")
                np.testing.assert_allclose(v, want_v, rtol=TOL, atol=TOL, err_msg=f"V layer {layer} seq {i}")
