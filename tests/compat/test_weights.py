"""Weights between releases and layouts: export / load with shape checks, unscan, a round trip through another release.

The parameter trees of 0.1.0 and 0.2.x have the same paths and shapes, so a round trip
(0.1.0 -> 0.2.5 -> 0.1.0, or 0.2.5 -> 0.1.0 -> 0.2.5) must give back every array bit for bit;
the partner release's dense logits on the same weights agree within float32 noise (measured
<= 3e-6 for the default family, |logits| <= 5, even across jax 0.7 / 0.11).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = [
    pytest.mark.envs("maxtext-0.1.0", "maxtext-0.1.0-jax011", "maxtext-0.2.5"),
    # make test-extended's in the backport's serving stack: maxtext-0.1.0 proves the release's calls
    pytest.mark.extended_in("maxtext-0.1.0-jax011"),
]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from helpers import crossrun as cr  # noqa: E402
from helpers.partner_env import require_env  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError, WeightsMismatchError  # noqa: E402
from maxtext_compat.serving import param_trees as weights  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
PARTNER = {"maxtext-0.2.5": "maxtext-0.1.0"}.get(os.environ.get("MAXTEXT_COMPAT_ENV", ""), "maxtext-0.2.5")
PROMPTS = ((3, 1, 4, 1, 5, 9, 2, 6), (5, 3, 5))
CROSS_TOL = 1e-5


def _model(family="default", scan=False, seed=0, **overrides):
    cfg = tiny.tiny_config(family, scan_layers=scan, **overrides)
    mesh = tiny.tiny_mesh(cfg)
    return cfg, mesh, tiny.tiny_transformer(cfg, mesh, seed=seed)


def _logits(cfg, mesh, model, tokens):
    def forward(state, t):
        m = nnx.merge(graphdef, state)
        pos = jnp.broadcast_to(jnp.arange(t.shape[1], dtype=jnp.int32), t.shape)
        return m(t, pos, decoder_segment_ids=jnp.ones_like(t), enable_dropout=False)

    graphdef, state = nnx.split(model)
    with tiny.mesh_context(cfg, mesh):
        return np.asarray(jax.jit(forward)(state, tokens))


TOKENS = np.random.default_rng(0).integers(0, 256, (2, 24)).astype(np.int32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A default model's weights on disk, and the partner release started on them (overlaps the tests below)."""
    tmp = tmp_path_factory.mktemp("weights")
    cfg, mesh, model = _model()
    path = weights.save_params(model, tmp / "w.npz")
    pending = None
    if cr.missing_env(PARTNER) is None:
        spec = cr.RunSpec("default", PROMPTS, 2, weights_in=str(path), weights_out=str(tmp / "back.npz"), paged=False)
        pending = cr.start_in_env(PARTNER, [spec])
    return cfg, mesh, model, path, tmp / "back.npz", pending


def test_export_save_load_round_trip(saved):
    cfg, mesh, model, path, _, _ = saved
    flat = weights.load_npz(path)
    assert flat.keys() == weights.export_params(model).keys()
    assert "token_embedder/embedding" in flat and "decoder/layers_1/self_attention/query/kernel" in flat
    _, _, other = _model(seed=5)
    assert not np.array_equal(
        weights.export_params(other)["token_embedder/embedding"], flat["token_embedder/embedding"]
    )
    assert weights.load_params(other, flat) is other
    for key, value in weights.export_params(other).items():
        np.testing.assert_array_equal(value, flat[key])
    np.testing.assert_array_equal(_logits(cfg, mesh, other, TOKENS), _logits(cfg, mesh, model, TOKENS))
    # Linen-style nested params load into a nested target of the same structure
    nested = weights.load_params({"params": {"a": {"b": np.zeros((2, 3))}}}, {"a/b": np.ones((2, 3))})
    assert nested["params"]["a"]["b"].tolist() == np.ones((2, 3)).tolist()


def test_mismatched_trees_raise_a_typed_error_naming_the_paths(saved):
    _, _, model, path, _, _ = saved
    flat = weights.load_npz(path)
    missing = dict(flat)
    del missing["decoder/decoder_norm/scale"]
    with pytest.raises(WeightsMismatchError) as err:
        weights.load_params(model, missing)
    assert err.value.missing == ["decoder/decoder_norm/scale"] and not err.value.extra and not err.value.mismatched
    assert "decoder/decoder_norm/scale" in str(err.value)
    extra = {**flat, "decoder/layers_2/mlp/wo/kernel": np.zeros((256, 128), np.float32)}
    with pytest.raises(WeightsMismatchError, match="extra 1") as err:
        weights.load_params(model, extra)
    assert err.value.extra == ["decoder/layers_2/mlp/wo/kernel"]
    bad = {**flat, "token_embedder/embedding": np.zeros((300, 128), np.float32)}
    with pytest.raises(WeightsMismatchError, match="shape mismatch") as err:
        weights.load_params(model, bad)
    assert err.value.mismatched == [("token_embedder/embedding", (300, 128), (256, 128))]
    assert isinstance(err.value, ValueError) and err.value.fix
    # nothing was loaded by the failed calls
    np.testing.assert_array_equal(
        weights.export_params(model)["token_embedder/embedding"], flat["token_embedder/embedding"]
    )


def _scan(flat, layers):
    """The scanned layout of an unscanned default tree (layer axis 1), built by hand."""
    out = {k: v for k, v in flat.items() if not k.startswith("decoder/layers_")}
    subs = {k.split("/", 2)[2] for k in flat if k.startswith("decoder/layers_0/")}
    for sub in subs:
        out[f"decoder/layers/{sub}"] = np.stack([flat[f"decoder/layers_{i}/{sub}"] for i in range(layers)], axis=1)
    return out


def test_scanned_tree_into_unscanned_model_points_at_unscan_params(saved):
    cfg, _, model, path, _, _ = saved
    flat = weights.load_npz(path)
    scanned = _scan(flat, cfg.num_decoder_layers)
    with pytest.raises(WeightsMismatchError) as err:
        weights.load_params(model, scanned)
    assert "unscan_params" in err.value.fix
    back = weights.unscan_params(scanned, cfg)
    assert back.keys() == flat.keys() and all(np.array_equal(back[k], flat[k]) for k in flat)
    with pytest.raises(InvalidArgumentError, match="number of layers"):
        weights.unscan_params(scanned, num_layers=3)
    with pytest.raises(InvalidArgumentError, match="disagree"):
        weights.unscan_params({**scanned, "decoder/layers/extra/scale": np.zeros((128, 5))})
    with pytest.raises(InvalidArgumentError, match="does not know"):
        weights.unscan_params({"decoder/moe_layers/mlp/wi/kernel": np.zeros((4, 2, 4))})
    assert weights.unscan_params(flat).keys() == flat.keys()  # unscanned: unchanged


def test_scan_params_stacks_what_the_hand_built_scan_stacks_and_unscan_inverts_it(saved):
    cfg, _, _, path, _, _ = saved
    flat = weights.load_npz(path)
    layers = int(cfg.num_decoder_layers)
    scanned = weights.scan_params(flat, num_layers=layers, scan_axis=1)
    want = _scan(flat, layers)
    assert scanned.keys() == want.keys() and all(np.array_equal(scanned[k], want[k]) for k in want)
    back = weights.unscan_params(scanned, num_layers=layers, scan_axis=1)
    assert back.keys() == flat.keys() and all(np.array_equal(back[k], flat[k]) for k in flat)
    with pytest.raises(InvalidArgumentError, match=r"layers 0\.\.num_layers-1") as err:
        weights.scan_params(flat, num_layers=layers + 1)
    assert err.value.argument == "num_layers"
    odd = {**flat, "decoder/layers_1/mlp/wo/kernel": np.zeros((3, 3), np.float32)}
    with pytest.raises(InvalidArgumentError, match="identical layers") as err:
        weights.scan_params(odd, num_layers=layers)
    assert err.value.argument == "decoder/layers_1" and "scan_layers=False" in err.value.fix


def test_unscan_params_of_a_real_scanned_model_gives_the_same_logits():
    cfg_s, mesh_s, scanned = _model(scan=True)
    cfg_u, mesh_u, unscanned = _model(seed=4)
    weights.load_params(unscanned, weights.unscan_params(weights.export_params(scanned), cfg_s))
    ours, theirs = _logits(cfg_u, mesh_u, unscanned, TOKENS), _logits(cfg_s, mesh_s, scanned, TOKENS)
    assert float(np.max(np.abs(ours - theirs))) <= 1e-5  # measured 0.0


@pytest.mark.envs("maxtext-0.1.0")
@pytest.mark.extended  # a 7-layer Gemma 3 compiled twice (~2.5 min); the llama blocks above run in make test
def test_unscan_params_of_gemma3_blocks_and_remainder():
    """7 layers scanned: one block of 6 (block axis at param_scan_axis) + layers_remainder/layers_0 -> layers_6."""
    cfg_s, mesh_s, scanned = _model("gemma3", scan=True, base_num_decoder_layers=7)
    flat = weights.export_params(scanned)
    assert any(k.startswith("decoder/layers/layers_5/") for k in flat)
    assert any(k.startswith("decoder/layers_remainder/layers_0/") for k in flat)
    cfg_u, mesh_u, unscanned = _model("gemma3", seed=4, base_num_decoder_layers=7)
    weights.load_params(unscanned, weights.unscan_params(flat, cfg_s))
    ours, theirs = _logits(cfg_u, mesh_u, unscanned, TOKENS), _logits(cfg_s, mesh_s, scanned, TOKENS)
    assert float(np.max(np.abs(ours - theirs))) <= 1e-5


@pytest.mark.extended_in("maxtext-0.2.5")  # one direction in make test: maxtext-0.1.0's, through 0.2.5
def test_round_trip_through_another_release(saved):
    """Weights -> the partner release (loaded, dense logits, exported) -> back here: bit for bit."""
    _, _, model, _, back, pending = saved
    require_env(PARTNER)
    (theirs,) = pending.results()
    assert theirs.meta["release"] != ROW.name and theirs.paged is None
    _, _, fresh = _model(seed=9)
    weights.load_params(fresh, weights.load_npz(back))
    original = weights.export_params(model)
    returned = weights.export_params(fresh)
    assert returned.keys() == original.keys()
    for key, value in original.items():
        np.testing.assert_array_equal(returned[key], value, err_msg=key)
    from maxtext_compat.decode import compare, dense_greedy

    ours = dense_greedy(model, PROMPTS, 2)
    worst = max(r.max_abs_logits_diff for r in compare(ours, theirs.dense))
    print(f"\nweights {ROW.name} -> {theirs.meta['release']} -> back: bit-identical; dense logits max|Δ| {worst:.2e}")
    assert ours.tokens() == theirs.dense.tokens() and worst <= CROSS_TOL
