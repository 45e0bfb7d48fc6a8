"""`convert --from-maxtext` without MaxText: the overrides it parses, the step it picks, the config keys it names.

The parameter trees here are built from MaxText's stored layout as its trainer writes it (read from a real
0.2.5 checkpoint's metadata: kernels (in, [layers,] out...) with the layer axis at param_scan_axis 1 when scanned,
`decoder/layers_<i>/...` when not), independently of the checker; a config that differs from the tree in one key
must be refused naming exactly that key, and the tree's own config must pass.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxtext_compat.convert.from_maxtext import check_trained_config, locate, parse_overrides, served_overrides
from maxtext_compat.errors import InvalidArgumentError, WeightsMismatchError

# Pure Python over the trees' shapes; the convert package needs numpy, so it runs beside the serving test.
pytestmark = pytest.mark.envs("maxtext-0.2.5-full")

# config attribute (what pyconfig computes) -> the override a user passes
KEYS = {
    "vocab_size": "vocab_size", "emb_dim": "base_emb_dim", "num_decoder_layers": "base_num_decoder_layers",
    "num_query_heads": "base_num_query_heads", "head_dim": "head_dim", "num_kv_heads": "base_num_kv_heads",
    "mlp_dim": "base_mlp_dim", "scan_layers": "scan_layers", "logits_via_embedding": "logits_via_embedding",
}  # fmt: skip


def _a(*shape: int) -> SimpleNamespace:
    return SimpleNamespace(shape=shape)


def stored_tree(c: SimpleNamespace) -> dict[str, SimpleNamespace]:
    """The parameter paths and shapes MaxText's trainer stores for a llama2-block model of config `c`."""
    V, E, L, H, D, K, M = (c.vocab_size, c.emb_dim, c.num_decoder_layers, c.num_query_heads, c.head_dim,
                           c.num_kv_heads, c.mlp_dim)  # fmt: skip
    per_layer = {
        "mlp/wi_0/kernel": (E, M), "mlp/wi_1/kernel": (E, M), "mlp/wo/kernel": (M, E),
        "pre_self_attention_layer_norm/scale": (E,), "post_self_attention_layer_norm/scale": (E,),
        "self_attention/query/kernel": (E, H, D), "self_attention/key/kernel": (E, K, D),
        "self_attention/value/kernel": (E, K, D), "self_attention/out/kernel": (H, D, E),
    }  # fmt: skip
    tree = {"token_embedder/embedding": _a(V, E), "decoder/decoder_norm/scale": _a(E)}
    if not c.logits_via_embedding:
        tree["decoder/logits_dense/kernel"] = _a(E, V)
    for sub, shape in per_layer.items():
        if c.scan_layers:  # the layer axis goes in at position 1 (param_scan_axis)
            tree[f"decoder/layers/{sub}"] = _a(shape[0], L, *shape[1:])
        else:
            tree.update({f"decoder/layers_{i}/{sub}": _a(*shape) for i in range(L)})
    return tree


configs = st.builds(
    SimpleNamespace,
    vocab_size=st.integers(8, 300), emb_dim=st.integers(8, 96), num_decoder_layers=st.integers(1, 4),
    num_query_heads=st.integers(1, 8), head_dim=st.integers(4, 64), num_kv_heads=st.integers(1, 8),
    mlp_dim=st.integers(8, 160), scan_layers=st.booleans(), logits_via_embedding=st.booleans(),
    param_scan_axis=st.just(1),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(configs)
def test_the_config_a_tree_was_trained_with_passes(c):
    check_trained_config(stored_tree(c), c)


@settings(max_examples=300, deadline=None)
@given(configs, st.sampled_from(sorted(KEYS)), st.integers(1, 5))
def test_a_config_that_differs_in_one_key_is_refused_naming_it(c, attr, step):
    tree = stored_tree(c)
    old = getattr(c, attr)
    wrong = SimpleNamespace(**vars(c))
    setattr(wrong, attr, (not old) if isinstance(old, bool) else old + step)
    with pytest.raises(WeightsMismatchError) as info:
        check_trained_config(tree, wrong)
    err = info.value
    assert err.argument == KEYS[attr], str(err)
    shown = str(old).lower() if isinstance(old, bool) else str(old)
    assert f"--set {KEYS[attr]}={shown}" in err.fix  # the fix gives the value the checkpoint was trained with


def test_parse_overrides_reads_values_as_maxtexts_command_line_does():
    got = parse_overrides(["base_emb_dim=64", "scan_layers=False", "model_name=llama3.1-8b", "dtype=float32",
                           "mlp_activations=[\"silu\",\"linear\"]", "rope_max_timescale=500000.0"])  # fmt: skip
    assert got == {"base_emb_dim": 64, "scan_layers": False, "model_name": "llama3.1-8b", "dtype": "float32",
                   "mlp_activations": ["silu", "linear"], "rope_max_timescale": 500000.0}  # fmt: skip


@pytest.mark.parametrize("bad", ["base_emb_dim", "=64", "  =1"])
def test_an_override_without_key_and_value_is_refused(bad):
    with pytest.raises(InvalidArgumentError) as info:
        parse_overrides([bad])
    assert info.value.argument == "--set"


def test_a_key_given_twice_is_refused():
    with pytest.raises(InvalidArgumentError, match="given twice"):
        parse_overrides(["vocab_size=256", "vocab_size=512"])


def _step(folder: Path, name: str, *, complete: bool = True) -> Path:
    items = folder / name / "items"
    items.mkdir(parents=True)
    if complete:
        (items / "_METADATA").write_text("{}")
    return items


def test_locate_takes_the_latest_complete_step(tmp_path):
    _step(tmp_path, "0")
    latest = _step(tmp_path, "10")
    _step(tmp_path, "2")
    _step(tmp_path, "12", complete=False)  # a save still being written: no metadata yet
    (tmp_path / "14.orbax-checkpoint-tmp").mkdir()  # what an interrupted async save leaves
    found = locate(tmp_path)
    assert (found.items, found.step) == (latest.absolute(), 10)


def test_locate_takes_a_step_or_its_items_folder(tmp_path):
    items = _step(tmp_path, "3")
    assert (locate(tmp_path / "3").items, locate(tmp_path / "3").step) == (items.absolute(), 3)
    assert (locate(items).items, locate(items).step) == (items.absolute(), 3)


@pytest.mark.parametrize("layout", ["nothing", "empty", "only-incomplete"])
def test_locate_refuses_a_folder_without_a_saved_step(tmp_path, layout):
    target = tmp_path / "checkpoints"
    if layout != "nothing":
        target.mkdir()
    if layout == "only-incomplete":
        _step(target, "5", complete=False)
    with pytest.raises(InvalidArgumentError) as info:
        locate(target)
    assert info.value.argument == "source"


def test_served_overrides_drop_the_run_and_keep_the_model():
    trained = {"base_emb_dim": 64, "model_name": "llama2-7b", "steps": 3, "run_name": "x", "attention": "dot_product",
               "per_device_batch_size": 4, "scan_layers": True, "max_target_length": 2048}  # fmt: skip
    got = served_overrides(trained, SimpleNamespace(dtype="bfloat16"), "float32")
    assert got == {"base_emb_dim": 64, "model_name": "llama2-7b", "dtype": "bfloat16", "scan_layers": False,
                   "weight_dtype": "float32"}  # fmt: skip
