"""Tests written for either era run unchanged on every release once the caller convention is declared.

Two test bodies in the style of MaxText's own attention tests (prefill, then autoregressive decode one
token at a time through MaxText's *own* contiguous KV cache, against a full-sequence train-mode reference;
f32 and bf16, cache-axis orders, reshape_q, sliding window, MLA):
`old_era` unpacks nothing (written for MaxText 0.1.0), `new_era` unpacks `(out, kv_cache)` on every call,
with no KV argument (written after PR #2616). Each release runs the body of its own era natively, and the
other era's body unchanged under `shims.install(convention=...)`: `kv_return` on 0.1.0 (vllm-backport),
`legacy` on 0.2.x (the call rule in MaxText's own classes). Both bodies make MaxText's own assertion
(decode equals the full-sequence output, tolerance below) and the foreign-era run gives exactly the
numbers of the native run (same module, weights and inputs). Across releases, the foreign-era run also equals
that body's native run on the release it was written for (new era: MaxText 0.2.5; old era: 0.1.0), run in
that environment on this release's Attention weights (tests/compat/era_partner.py). Without the declaration
the new-era body on 0.1.0 fails with "not enough values to unpack" and the old-era body on 0.2.x gets tuples.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

# In make test the two eras' representative releases run it (0.1.0's Linen layers, 0.2.5's scan carry); on the
# others it repeats the same proof against the same partner (about 100 s each, cold): make test-extended runs it there.
pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.extended_in(
        "maxtext-0.2.0", "maxtext-0.2.1", "maxtext-0.2.2", "maxtext-0.2.3", "maxtext-0.2.4", "maxtext-0.1.0-jax011"
    ),
]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from maxtext_compat import shims  # noqa: E402
from maxtext_compat.convention.callers import set_caller_convention  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
LEGACY = not ROW.has_kv_params
NATIVE_ERA = "old" if LEGACY else "new"
FOREIGN_ERA = "new" if LEGACY else "old"
FOREIGN = {"old": "legacy", "new": "kv_return"}  # the convention a body of each era declares
BATCH, TOTAL, PREFILL = 2, 24, 16
# MaxText's own autoregression tests use rtol=atol=1e-2 for every dtype; measured here: f32 ~7e-7, bf16 ~3e-2
# (bf16 rounds q/k/v differently in one pass and in the cache), so bf16 gets MaxText's bf16 tolerance.
TOLERANCE = {"float32": 1e-5, "bfloat16": 6e-2}

MLA = {"q_lora_rank": 0, "kv_lora_rank": 32, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 128}
VARIANTS = {
    "f32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "cache-axes-0123": {"prefill_cache_axis_order": "0,1,2,3", "ar_cache_axis_order": "0,1,2,3"},
    "cache-axes-0213": {"prefill_cache_axis_order": "0,2,1,3", "ar_cache_axis_order": "0,2,1,3"},
    "reshape-q": {"reshape_q": True},
    "sliding-window": {"sliding_window_size": 8},
    "mla": {"attention_type": "mla", "base_num_kv_heads": 2, **MLA},
}


@pytest.fixture(autouse=True)
def _builtin_profiles():
    """MaxText's profiles and default chooser (unit tests before this module may have cleared them)."""
    from maxtext_compat.shims import maxtext_profiles

    maxtext_profiles.register()


def old_era(attention, x, pos, seg):
    """Written for MaxText 0.1.0: every call returns the attention output."""
    full = attention(x, x, pos, seg, deterministic=True, model_mode="train")
    pre = attention(x[:, :PREFILL], x[:, :PREFILL], pos[:, :PREFILL], seg[:, :PREFILL], deterministic=True,
                    model_mode="prefill")  # fmt: skip
    steps = []
    for i in range(PREFILL, TOTAL):
        xi = x[:, i : i + 1]
        steps.append(attention(xi, xi, pos[:, i : i + 1], None, deterministic=True, model_mode="autoregressive"))
    return full, pre, jnp.concatenate(steps, axis=1)


def new_era(attention, x, pos, seg):
    """Written after MaxText PR #2616: every call returns (out, kv_cache), unpacked even without a KV argument."""
    full, _ = attention(x, x, pos, seg, deterministic=True, model_mode="train")
    pre, _ = attention(x[:, :PREFILL], x[:, :PREFILL], pos[:, :PREFILL], seg[:, :PREFILL], deterministic=True,
                       model_mode="prefill")  # fmt: skip
    steps = []
    for i in range(PREFILL, TOTAL):
        xi = x[:, i : i + 1]
        out, _ = attention(xi, xi, pos[:, i : i + 1], None, deterministic=True, model_mode="autoregressive")
        steps.append(out)
    return full, pre, jnp.concatenate(steps, axis=1)


BODIES = {"old": old_era, "new": new_era}


def _attention(cfg, mesh, variant):
    """A fresh MaxText Attention (MLA for that variant) with the same weights every time (seed 0)."""
    a = tiny.api()
    kw: dict = {}
    cls = a.cls("attention")
    if variant == "sliding-window":
        kw = {"attention_type": a.common_types.AttentionType.LOCAL_SLIDING, "sliding_window_size": 8}
    if variant == "mla":
        cls, kw = a.cls("mla"), {"attention_type": a.common_types.AttentionType.MLA, **MLA}
    return cls(
        config=cfg, num_query_heads=cfg.num_query_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        max_target_length=cfg.max_target_length, max_prefill_predict_length=cfg.max_prefill_predict_length,
        mesh=mesh, attention_kernel=cfg.attention, inputs_q_shape=(BATCH, TOTAL, cfg.emb_dim),
        inputs_kv_shape=(BATCH, TOTAL, cfg.emb_dim), dtype=cfg.dtype, weight_dtype=cfg.weight_dtype,
        model_mode="prefill", rngs=nnx.Rngs(params=0, dropout=1), **kw,
    )  # fmt: skip


def _config(variant):
    cfg = tiny.tiny_config("default", max_target_length=TOTAL, max_prefill_predict_length=PREFILL,
                           **VARIANTS[variant])  # fmt: skip
    return cfg, tiny.tiny_mesh(cfg)


def _save_weights(variant, path):
    """This release's Attention for `variant` (seed 0, as _run builds it) written to an .npz."""
    from maxtext_compat.serving.param_trees import save_params

    cfg, mesh = _config(variant)
    with tiny.mesh_context(cfg, mesh):
        save_params(_attention(cfg, mesh, variant), path)


def _run(variant, era, declare=None, *, weights_in=None):
    """One body on a fresh Attention: (config, (full, prefill, decoded)).

    weights_in: an .npz of the Attention's parameters to load first (the cross-release comparison moves them
    to the release the body was written for)."""
    from maxtext_compat.serving.param_trees import load_npz, load_params

    cfg, mesh = _config(variant)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((BATCH, TOTAL, cfg.emb_dim)), dtype=cfg.dtype)
    pos = jnp.broadcast_to(jnp.arange(TOTAL, dtype=jnp.int32), (BATCH, TOTAL))
    seg = jnp.ones((BATCH, TOTAL), jnp.int32)
    with tiny.mesh_context(cfg, mesh):
        attention = _attention(cfg, mesh, variant)
        if weights_in is not None:
            load_params(attention, load_npz(weights_in), where=f"MaxText {ROW.name} attention ({variant})")
        if declare is None:
            return cfg, BODIES[era](attention, x, pos, seg)
        before = shims.active_profiles()
        shims.install(convention=declare)
        try:
            return cfg, BODIES[era](attention, x, pos, seg)
        finally:
            for name in reversed(shims.active_profiles()):
                if name not in before:
                    shims.uninstall(name)
            set_caller_convention(None)  # the profile carrying it may have been installed before


def _maxtexts_assertion(cfg, result, variant):
    full, pre, decoded = (np.asarray(a, np.float32) for a in result)
    tol = TOLERANCE[str(np.dtype(cfg.dtype))]
    np.testing.assert_allclose(pre, full[:, :PREFILL], rtol=tol, atol=tol)
    if variant != "sliding-window":
        np.testing.assert_allclose(decoded, full[:, PREFILL:], rtol=tol, atol=tol)
    # Sliding window: MaxText's own decode step (dot-product, contiguous cache) does not apply the window the
    # way its train pass does, in 0.1.0 and 0.2.5 alike (measured: up to 1.19 apart), so only the prefill is
    # checked against the full pass; the decode is still compared across eras, exactly, below.


# The release each era's body was written for: its native run there is the reference for the declared run
# here, on this release's Attention weights. Measured: exact (0.0) where both environments have the same jax
# (0.2.5 vs 0.1.0-jax011); MaxText 0.1.0 on its older jax vs 0.2.5: f32 <= 1.7e-6, bf16 exact.
WRITTEN_FOR = {"new": "maxtext-0.2.5", "old": "maxtext-0.1.0-jax011"}
CROSS_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}


class _WrittenFor:
    """The foreign-era body run natively in the environment of the release it was written for (every variant,
    one process started by the fixture; `result(variant)` waits for it)."""

    def __init__(self, work):
        import json
        import os
        import subprocess
        from pathlib import Path

        from helpers.crossrun import CPU_ENV
        from maxtext_compat.runner.envs import env_python, project_root

        self.env = WRITTEN_FOR[FOREIGN_ERA]
        self.outs, runs = {}, []
        self.process = None
        for variant in VARIANTS:
            weights = work / f"{variant}.weights.npz"
            _save_weights(variant, weights)
            self.outs[variant] = _partner_answer_path(self.env, variant, weights) or work / f"{variant}.out.npz"
            if self.outs[variant].is_file():
                os.utime(self.outs[variant])  # used: the matrix runner prunes answers unused for two weeks
            else:
                runs.append({"variant": variant, "weights": str(weights), "out": str(self.outs[variant])})
        self.log = work / "log.txt"
        if not runs:  # every answer already computed by this partner for these exact weights
            return
        request = work / "request.json"
        request.write_text(json.dumps({"era": FOREIGN_ERA, "runs": runs}))
        with open(self.log, "w") as f:
            self.process = subprocess.Popen(
                [str(env_python(self.env)), str(Path(__file__).with_name("era_partner.py")), str(request)],
                cwd=project_root(), stdout=f, stderr=subprocess.STDOUT,
                env={**os.environ, **CPU_ENV, **self._compile_cache(), "MAXTEXT_COMPAT_ENV": self.env},
            )  # fmt: skip

    def _compile_cache(self):
        """The partner's own JAX compilation cache when this run has one (not this environment's)."""
        import os

        from maxtext_compat.runner.caches import compile_cache_env

        return compile_cache_env(self.env) if os.environ.get("JAX_COMPILATION_CACHE_DIR") else {}

    def result(self, variant):
        import subprocess

        code = 0
        if self.process is not None:
            try:
                code = self.process.wait(timeout=900)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
        if code != 0 or not self.outs[variant].is_file():
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"the {FOREIGN_ERA}-era body did not run natively in {self.env} (exit {code}):\n{tail}")
        with np.load(self.outs[variant]) as npz:
            return {k: npz[k] for k in npz.files}


def _partner_answer_path(env, variant, weights):
    """Where a partner's answer for one variant lives between environments of one matrix run (None: no cache).

    The 0.2.x environments build identical Attention weights (same init, same jax), so the partner would
    compute the same numbers five times: its answer is stored under a key of everything that decides it —
    the partner environment's spec, this file and era_partner.py (the bodies), our own source, the variant
    and the weights' bytes — beside the JAX compilation cache, and only when the matrix runner set one up."""
    import hashlib
    import os

    from maxtext_compat.runner.caches import partner_answers_dir

    folder = partner_answers_dir()  # where the runner prunes them (the child inherits its cache settings)
    fixed = _partner_fixed_digest(env)
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR") or folder is None or fixed is None:
        return None
    h = hashlib.sha256(fixed)
    for part in (variant.encode(), weights.read_bytes()):
        h.update(hashlib.sha256(part).digest())
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{h.hexdigest()}.npz"


@functools.cache
def _partner_fixed_digest(env):
    """The part of the key that is the same for every variant (read once per module), or None when the
    partner environment has no build record."""
    import hashlib
    from pathlib import Path

    from maxtext_compat.runner.envs import env_path

    spec = env_path(env) / "maxtext-compat-env.json"  # its spec hash and versions, written when it was built
    if not spec.is_file():
        return None
    here = Path(__file__)
    ours = sorted(Path(shims.__file__).parent.parent.rglob("*.py"))  # the partner loads weights with our code
    h = hashlib.sha256()
    for part in (env.encode(), spec.read_bytes(), here.read_bytes(), here.with_name("era_partner.py").read_bytes(),
                 *(f.read_bytes() for f in ours)):  # fmt: skip
        h.update(hashlib.sha256(part).digest())
    return h.digest()


@pytest.fixture(scope="module")
def written_for(tmp_path_factory):
    from helpers.partner_env import require_env  # here: era_partner.py imports this module without conftest

    require_env(WRITTEN_FOR[FOREIGN_ERA])
    runs = _WrittenFor(tmp_path_factory.mktemp("written_for"))
    yield runs
    if runs.process is not None and runs.process.poll() is None:
        runs.process.kill()
        runs.process.wait()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_other_eras_test_runs_unchanged_and_equals_the_native_one(variant, written_for):
    """Same release: the declared run equals the native-era run exactly. Across releases: it equals the body's
    own native run on the release it was written for (same weights and inputs)."""
    cfg, native = _run(variant, NATIVE_ERA)
    _maxtexts_assertion(cfg, native, variant)
    _, declared = _run(variant, FOREIGN_ERA, declare=FOREIGN[FOREIGN_ERA])
    _maxtexts_assertion(cfg, declared, variant)
    for ours, theirs in zip(declared, native, strict=True):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))
    assert "call-rule" not in shims.active_profiles()  # the install that brought it took it away
    tol = CROSS_TOLERANCE[str(np.dtype(cfg.dtype))]
    theirs = written_for.result(variant)
    for name, ours in zip(("full", "prefill", "decoded"), declared, strict=True):
        where = f"{name}: declared on {ROW.name} vs native on {written_for.env}"
        np.testing.assert_allclose(np.asarray(ours, np.float32), theirs[name], rtol=tol, atol=tol, err_msg=where)


def test_without_a_declaration_the_other_eras_first_call_is_misread():
    """Why the declaration exists: the call that names no KV argument looks the same from both eras."""
    cfg = tiny.tiny_config("default", max_target_length=TOTAL, max_prefill_predict_length=PREFILL)
    mesh = tiny.tiny_mesh(cfg)
    x = jnp.ones((BATCH, TOTAL, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(TOTAL, dtype=jnp.int32), (BATCH, TOTAL))
    with tiny.mesh_context(cfg, mesh):
        attention = _attention(cfg, mesh, "f32")
        out = attention(x, x, pos, jnp.ones((BATCH, TOTAL), jnp.int32), deterministic=True, model_mode="train")
    if LEGACY:  # new-era `full, _ = out` would silently take batch row 0 as the output
        assert isinstance(out, jax.Array) and out.shape == (BATCH, TOTAL, cfg.emb_dim)
    else:  # old-era `full = out` would hold a tuple
        assert isinstance(out, tuple) and len(out) == 2


# ----------------------------------------------------------------------------------------------
# Decoder layers, scanned and unscanned: `y = layer(...)` (old era) and `y, _ = layer(...)` (new era)
# ----------------------------------------------------------------------------------------------


def old_era_layer(call):
    y = call()
    return y[0] if isinstance(y, tuple) else y  # a scanned layer's own old return is (y, None)


def new_era_layer(call):
    y, _ = call()
    return y


LAYER_BODIES = {"old": old_era_layer, "new": new_era_layer}


def _layer_run(scan, era, declare=None):
    cfg = tiny.tiny_config("default", scan_layers=scan)
    mesh = tiny.tiny_mesh(cfg)
    cls = ROW.decoder_layers["llama2"].load()
    x = jax.random.normal(jax.random.PRNGKey(0), (BATCH, 16, cfg.emb_dim))
    pos = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (BATCH, 16))
    seg = jnp.ones((BATCH, 16), jnp.int32)
    with tiny.mesh_context(cfg, mesh):
        if LEGACY:  # Linen: init once (same key), apply in the body
            layer = cls(config=cfg, mesh=mesh, name="layers_0", quant=None, model_mode="train")
            v = layer.init({"params": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(1)}, x, seg, pos, True,
                           "train")  # fmt: skip

            def call():
                return layer.apply(v, x, seg, pos, True, "train")
        else:
            layer = cls(config=cfg, model_mode="train", mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1), quant=None)

            def call():
                return layer(x, seg, pos, True, "train")

        before = shims.active_profiles()
        if declare is not None:
            shims.install(convention=declare)
        try:
            return LAYER_BODIES[era](call)
        finally:
            for name in reversed(shims.active_profiles()):
                if name not in before:
                    shims.uninstall(name)
            set_caller_convention(None)  # the profile carrying it may have been installed before


@pytest.mark.parametrize("scan", [False, True], ids=["unscanned", "scanned"])
def test_the_other_eras_layer_test_runs_unchanged_and_equals_the_native_one(scan):
    native = _layer_run(scan, NATIVE_ERA)
    declared = _layer_run(scan, FOREIGN_ERA, declare=FOREIGN[FOREIGN_ERA])
    assert isinstance(declared, jax.Array) and declared.shape == native.shape == (BATCH, 16, declared.shape[-1])
    np.testing.assert_array_equal(np.asarray(declared), np.asarray(native))


def test_mla_refuses_a_paged_cache_instead_of_returning_it_unwritten():
    """MaxText's MLA has no ragged-paged-attention path in any release (0.2.x hands the cache back untouched)."""
    from maxtext_compat.adapters import wrap
    from maxtext_compat.errors import InvalidArgumentError

    cfg = tiny.tiny_config("default", max_target_length=TOTAL, max_prefill_predict_length=PREFILL,
                           **VARIANTS["mla"])  # fmt: skip
    mesh = tiny.tiny_mesh(cfg)
    x = jnp.ones((4, 1, cfg.emb_dim))
    with tiny.mesh_context(cfg, mesh):
        mla = wrap(_attention(cfg, mesh, "mla"))
        with pytest.raises(InvalidArgumentError, match="multi-head latent attention") as e:
            mla(x, x, jnp.zeros((4, 1), jnp.int32), None, model_mode="autoregressive", kv_cache=jnp.zeros((8, 16)),
                attention_metadata=object())  # fmt: skip
    assert e.value.argument == "kv_cache" and "(8, 16)" in str(e.value)
