"""A declared caller convention holds on every call, on every release; MaxText's own calls keep theirs.

`kv_return` (code written after MaxText PR #2616: `out, _ = attention(...)` on every call) gets the new
shape even from calls that name no KV argument, on MaxText 0.1.0 too; `legacy` gets the old shape and a call
naming the KV arguments is a ConventionMismatchError, never a silent unpack. Values are compared with the
native call of the same module and weights, exactly (same program). Batch 2 throughout.
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
from maxtext_compat.convention import callers  # noqa: E402
from maxtext_compat.errors import ConventionMismatchError  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
LEGACY = not ROW.has_kv_params
FAMILIES = {"default": "llama2", "qwen3": "qwen3", "gemma3": "gemma3"}
NONES = {"kv_cache": None, "attention_metadata": None}


@pytest.fixture(autouse=True)
def _builtin_profiles():
    """MaxText's profiles and default chooser (unit tests before this module may have cleared them)."""
    from maxtext_compat.shims import maxtext_profiles

    maxtext_profiles.register()


def _equal(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class _frozen(dict):
    def __hash__(self):
        return hash(tuple(sorted(self)))


def _attention(m, x, pos, seg, extra):
    return m(x, x, pos, seg, model_mode="train", deterministic=True, **extra)


@pytest.fixture(scope="module")
def default_model():
    cfg = tiny.tiny_config("default")
    return cfg, tiny.tiny_mesh(cfg)


@pytest.fixture
def attention_run(default_model):
    cfg, mesh = default_model
    attn = tiny.tiny_attention(cfg, mesh)
    inp = tiny.tiny_inputs(cfg)

    def run(module, extra=(), jit=False):
        call = nnx.jit(_attention, static_argnums=4) if jit else _attention
        with tiny.mesh_context(cfg, mesh):
            return call(module, inp["x"], inp["positions"], inp["segment_ids"], _frozen(dict(extra)))

    def native(jit=False):  # the same program as the adapted call (eager or jitted)
        out = run(attn, NONES if not LEGACY else {}, jit=jit)
        return out if LEGACY else out[0]

    return attn, run, native


# ----------------------------------------------------------------------------------------------
# kv_return: the new shape on every call
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx.jit"])
def test_kv_return_attention_gets_a_tuple_from_a_call_without_kv_arguments(attention_run, jit):
    attn, run, native = attention_run
    out = run(wrap(attn, convention="kv_return"), jit=jit)
    assert isinstance(out, tuple) and len(out) == 2 and out[1] is None, type(out)
    _equal(out[0], native(jit))


def _run_layer(family, cfg, mesh, convention, extra=()):
    """(native old-call result, adapter result) of one layer and its weights, train mode."""
    cls = ROW.decoder_layers[FAMILIES[family]].load()
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    seg = jnp.ones((2, 16), jnp.int32)
    extra = dict(extra)
    with tiny.mesh_context(cfg, mesh):
        if issubclass(cls, nn.Module):  # 0.1.0: Linen init/apply with the adapted subclass
            kw = {"config": cfg, "mesh": mesh, "name": "layers_0", "quant": None, "model_mode": "train"}
            if family == "gemma3":
                kw["attention_type"] = __import__(cls.__module__, fromlist=["x"]).get_attention_type(layer_id=0)
            native, adapted = cls(**kw), wrap(cls, convention=convention)(**kw)
            key = jax.random.PRNGKey(1)
            v = jax.jit(lambda k: native.init({"params": k, "dropout": k, "aqt": k}, x, seg, pos, True, "train"))(key)
            n = jax.jit(lambda v: native.apply(v, x, seg, pos, True, "train"))(v)
            return n, jax.jit(lambda v: adapted.apply(v, x, seg, pos, True, "train", **extra))(v)
        layer = cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)
        native = nnx.jit(lambda m, x: m(x, seg, pos, True, "train"))(layer, x)
        ours = nnx.jit(lambda m, x: m(x, seg, pos, True, "train", **extra))(wrap(layer, convention=convention), x)
        return native, ours


def _y(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("family", list(FAMILIES))
def test_kv_return_decoder_layer_gets_y_and_none(family):
    cfg = tiny.tiny_config(family)
    native, ours = _run_layer(family, cfg, tiny.tiny_mesh(cfg), "kv_return")
    assert isinstance(ours, tuple) and len(ours) == 2 and ours[1] is None, type(ours)
    _equal(ours[0], _y(native))


def test_kv_return_scanned_layer_keeps_y_and_none():
    cfg = tiny.tiny_config("default", scan_layers=True)
    native, ours = _run_layer("default", cfg, tiny.tiny_mesh(cfg), "kv_return")
    assert isinstance(ours, tuple) and len(ours) == 2 and ours[1] is None
    _equal(ours[0], _y(native))


@pytest.fixture(scope="module")
def transformer(default_model):
    cfg, mesh = default_model
    return cfg, mesh, tiny.tiny_transformer(cfg, mesh)


def _fwd(m, tokens, pos, seg):
    return m(tokens, pos, decoder_segment_ids=seg, enable_dropout=False)


def test_kv_return_transformer_outside_vllm_mode_returns_logits_as_the_release_does(transformer):
    """MaxText 0.2.x's Transformer returns bare logits unless its config is a vLLM mode: that *is* the new shape."""
    cfg, mesh, model = transformer
    inp = tiny.tiny_inputs(cfg)
    args = (inp["tokens"], inp["positions"], inp["segment_ids"])
    with tiny.mesh_context(cfg, mesh):
        native = nnx.jit(_fwd)(model, *args)
        ours = nnx.jit(_fwd)(wrap(model, convention="kv_return"), *args)
    assert isinstance(ours, jax.Array)
    _equal(ours, native)


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4")
def test_kv_return_nnx_decoder_gets_three(transformer):
    cfg, mesh, model = transformer
    inp = tiny.tiny_inputs(cfg)

    def run(m, decoder, tokens, pos, seg):
        return decoder(m.token_embedder, tokens, pos, decoder_segment_ids=seg, deterministic=True, model_mode="train")

    with tiny.mesh_context(cfg, mesh):
        native = nnx.jit(run)(model, model.decoder, inp["tokens"], inp["positions"], inp["segment_ids"])
        ours = nnx.jit(run)(model, wrap(model.decoder, convention="kv_return"), inp["tokens"], inp["positions"],
                            inp["segment_ids"])  # fmt: skip
    assert isinstance(ours, tuple) and len(ours) == 3 and ours[2] is None
    _equal(ours[0], native[0])
    _equal(ours[1], native[1])


# ----------------------------------------------------------------------------------------------
# legacy: the old shape on every call; a call naming the KV arguments is refused
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx.jit"])
def test_legacy_attention_returns_bare_and_refuses_a_new_call(attention_run, jit):
    attn, run, native = attention_run
    legacy = wrap(attn, convention="legacy")
    out = run(legacy, jit=jit)
    assert isinstance(out, jax.Array)
    _equal(out, native(jit))
    with pytest.raises(ConventionMismatchError) as e:
        run(legacy, NONES, jit=jit)
    assert e.value.argument == "kv_cache / attention_metadata" and "wrap(convention=)" in str(e.value)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_legacy_decoder_layer_returns_bare_y(family):
    cfg = tiny.tiny_config(family)
    native, ours = _run_layer(family, cfg, tiny.tiny_mesh(cfg), "legacy")
    assert isinstance(ours, jax.Array), type(ours)
    _equal(ours, _y(native))


def test_legacy_decoder_layer_refuses_kv_cache_none():
    cfg = tiny.tiny_config("default")
    with pytest.raises(ConventionMismatchError):
        _run_layer("default", cfg, tiny.tiny_mesh(cfg), "legacy", NONES)


# ----------------------------------------------------------------------------------------------
# Where the declaration comes from, and who it reaches
# ----------------------------------------------------------------------------------------------


def test_declarations_in_code_and_environment_and_their_order(attention_run, monkeypatch):
    """wrap() beats a `with` block, which beats the process, which beats the environment; auto is the default."""
    attn, run, native = attention_run
    adapted = wrap(attn)
    assert not isinstance(run(adapted), tuple)  # auto, no KV argument: the old shape
    monkeypatch.setenv(callers.ENV, "kv_return")
    assert isinstance(run(adapted), tuple)
    previous = callers.set_caller_convention("legacy")
    try:
        assert not isinstance(run(adapted), tuple)
        with callers.caller_convention("kv_return"):
            out = run(adapted)
            assert isinstance(out, tuple)
            assert not isinstance(run(wrap(attn, convention="auto")), tuple)  # wrap(): most specific
        assert not isinstance(run(adapted), tuple)
    finally:
        callers.set_caller_convention(previous.value if previous else None)
    _equal(out[0], native())
    monkeypatch.setenv(callers.ENV, "tuple")
    with pytest.raises(callers.InvalidArgumentError, match=callers.ENV):
        run(adapted)


def test_shims_install_declares_for_the_process_until_uninstalled(attention_run):
    from maxtext_compat import shims

    attn, run, _ = attention_run
    adapted = wrap(attn)
    shims.register_profile("declaring-nothing", lambda: [], replace=True)
    try:
        shims.install("declaring-nothing", convention="kv_return")
        assert callers.process_convention().source == "shims.install('declaring-nothing', convention=)"
        assert isinstance(run(adapted), tuple)
    finally:
        shims.uninstall("declaring-nothing")
        shims.unregister_profile("declaring-nothing")
    assert callers.process_convention() is None
    assert not isinstance(run(adapted), tuple)


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2", "maxtext-0.2.1", "maxtext-0.2.0")
def test_legacy_never_reaches_maxtexts_own_calls():
    """0.2.x's own layer calls its Attention with kv_cache=None: under a process-wide `legacy` that call is
    MaxText's, so it keeps the release's convention, while the user's old call of the layer gets y."""
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
        with callers.caller_convention("legacy"):
            ours = call(wrap(layer), x)
    assert isinstance(ours, jax.Array)
    _equal(ours, native[0])


@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011")
def test_kv_return_through_the_shim_leaves_maxtexts_own_old_calls_alone(transformer):
    """On 0.1.0 with the vllm-backport shim and a process-wide `kv_return`, the user's Transformer call gets its
    logits (the new shape outside a vLLM mode) while the old calls MaxText 0.1.0 makes inside it (Decoder ->
    layer -> Attention, all shimmed) keep their bare returns: a tuple there would break its layers."""
    from maxtext_compat import shims

    cfg, mesh, model = transformer
    inp = tiny.tiny_inputs(cfg)
    args = (inp["tokens"], inp["positions"], inp["segment_ids"])
    with tiny.mesh_context(cfg, mesh):
        native = nnx.jit(_fwd)(model, *args)
        with shims.patched("vllm-backport"):
            previous = callers.set_caller_convention("kv_return")
            try:
                jax.clear_caches()
                logits = nnx.jit(_fwd)(model, *args)  # the Transformer outside a vLLM mode: logits
            finally:
                callers.set_caller_convention(previous.value if previous else None)
    assert isinstance(logits, jax.Array)
    _equal(logits, native)


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2", "maxtext-0.2.1", "maxtext-0.2.0")
def test_install_with_a_convention_puts_the_rule_into_maxtexts_own_classes(attention_run):
    """shims.install(convention='legacy') on 0.2.x: MaxText's own (unwrapped) classes answer old code with the
    old shape, a new call is refused, the Transformer still computes native logits through MaxText's own
    calls inside it; uninstalling takes the call rule and the declaration away again."""
    from maxtext_compat import doctor, shims

    attn, run, native = attention_run
    want = native()  # MaxText's own new call: made before the declaration refuses it
    before = shims.active_profiles()
    shims.install(convention="legacy")
    try:
        assert "call-rule" in shims.active_profiles()
        out = run(attn)
        assert isinstance(out, jax.Array)
        _equal(out, want)
        _equal(run(wrap(attn)), want)  # an adapter over the shimmed class: the rule is applied once
        with pytest.raises(ConventionMismatchError, match=r"shims\.install"):
            run(attn, NONES)
        text = doctor.render(doctor.collect())
        assert "caller convention: legacy (from shims.install(" in text
    finally:
        for name in reversed(shims.active_profiles()):
            if name not in before:
                shims.uninstall(name)
    assert "call-rule" not in shims.active_profiles() and callers.process_convention() is None
    assert isinstance(run(attn), tuple)  # MaxText 0.2.x's own return again


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2", "maxtext-0.2.1", "maxtext-0.2.0")
def test_legacy_process_transformer_runs_maxtexts_own_calls_natively(transformer):
    from maxtext_compat import shims

    cfg, mesh, model = transformer
    inp = tiny.tiny_inputs(cfg)
    args = (inp["tokens"], inp["positions"], inp["segment_ids"])
    before = shims.active_profiles()
    with tiny.mesh_context(cfg, mesh):
        native = nnx.jit(_fwd)(model, *args)
        shims.install(convention="legacy")
        try:
            jax.clear_caches()
            ours = nnx.jit(_fwd)(model, *args)
        finally:
            for name in reversed(shims.active_profiles()):
                if name not in before:
                    shims.uninstall(name)
            callers.set_caller_convention(None)  # the profile carrying it may have been installed before
    assert isinstance(ours, jax.Array)
    _equal(ours, native)


@pytest.mark.envs("maxtext-0.2.5")
def test_an_adapter_over_a_rule_shim_under_another_profile_applies_the_rule_once():
    """known-defects stacked on top of call-rule (LlamaDecoderLayer): the adapter cannot see the rule shim
    under the outer wrapper, so the shim passes the adapter's call through; an old call's y is the whole
    batch, never `y[0]` taken twice (batch row 0)."""
    from maxtext_compat import shims

    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    before = shims.active_profiles()
    native, _ = _run_layer("default", cfg, mesh, None)
    shims.install("call-rule")
    shims.install("known-defects")
    try:
        jax.clear_caches()
        target = f"{ROW.decoder_layers['llama2']}.__call__"
        assert {p.profile for p in shims.active_patches() if p.target == target} == {"known-defects", "call-rule"}
        _, ours = _run_layer("default", cfg, mesh, None)
    finally:
        for name in reversed(shims.active_profiles()):
            if name not in before:
                shims.uninstall(name)
        callers.set_caller_convention(None)  # the profile carrying it may have been installed before
    assert isinstance(ours, jax.Array) and ours.shape == _y(native).shape, type(ours)
    _equal(ours, _y(native))
