"""tpu-inference's per-layer attention_metadata dict (several KV-cache groups): handled or refused, never mis-indexed.

tpu-inference (0.28 and later) hands a model a dict of AttentionMetadata keyed by layer when it has several
KV-cache groups. MaxText 0.2.5's NNXDecoder reads `md.get("layer.{i}", md.get(i))` per layer, so a dict
without a layer's key gives that layer None, and its attention returns a dummy result without writing the
cache. Through the adapters: a dict is passed on where the release reads it (0.2.5) once every layer has an
entry, and on 0.1.0 the backport hands each layer its own entry too (it refused several KV-cache groups
before, where 0.2.5 ran them: issue 35, the two paths agree); refused otherwise. Results are compared with the
same step given one AttentionMetadata: logits and every KV cache equal, element for element.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from helpers import crossrun as cr  # noqa: E402
from maxtext_compat import paged  # noqa: E402
from maxtext_compat.adapters import wrap  # noqa: E402
from maxtext_compat.errors import InvalidArgumentError  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
LENGTHS = {"A": 7, "B": 3}


@pytest.fixture(scope="module")
def step():
    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.decode.paged import cache_mesh_for, layout_for_model

    assert cpu_rpa.install().active
    native, _ = cr.build(cr.RunSpec("default", ((1,),), dense=False))
    model = wrap(native)
    layout = layout_for_model(model, num_pages=4, page_size=16, mesh=cache_mesh_for(model))
    alloc = paged.PageAllocator(4, 16)
    seqs = [paged.SequenceSlice(n, n, alloc.allocate(s, n), s) for s, n in LENGTHS.items()]
    md = paged.build_metadata(seqs, layout, max_num_tokens=16, max_num_seqs=2, pages_per_seq=1)
    rng = np.random.default_rng(0)
    tokens = md.to_kernel_order(rng.integers(0, 256, sum(LENGTHS.values())).astype(np.int32))
    positions = md.to_kernel_order(np.concatenate([np.arange(n, dtype=np.int32) for n in LENGTHS.values()]))
    num_layers = model.config.num_decoder_layers

    def run(metadata, module=model):
        caches = layout.allocate(num_layers, mesh=cache_mesh_for(model))
        return module(jnp.asarray(tokens)[:, None], jnp.asarray(positions)[:, None], kv_caches=caches,
                      attention_metadata=metadata, model_mode="autoregressive")  # fmt: skip

    run.native = native
    run.layout, run.pages, run.md = layout, [s.pages for s in seqs], md
    return run, md.to_attention_metadata(), num_layers


def _equal(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_dict_with_every_layers_entry_gives_the_single_metadata_result(step):
    run, md, layers = step
    want_hidden, want_caches = run(md)
    hidden, caches = run({f"layer.{i}": md for i in range(layers)})
    _equal(hidden, want_hidden)
    assert len(caches) == len(want_caches) == layers
    for a, b in zip(caches, want_caches, strict=True):
        _equal(a, b)
    assert any(np.abs(np.asarray(c)).max() > 0 for c in caches)  # the step wrote the caches


def test_integer_keys_are_read_as_maxtext_reads_them(step):
    run, md, layers = step
    want_hidden, _ = run(md)
    hidden, _ = run(dict(enumerate([md] * layers)))
    _equal(hidden, want_hidden)


@pytest.mark.envs("maxtext-0.2.5")
def test_stock_maxtext_runs_a_layer_missing_from_the_dict_without_its_cache(step):
    """Why the check: MaxText 0.2.5 alone gives the missing layer None and returns without an error; that
    layer's attention takes its dry-run branch, so its KV cache comes back as an empty list (the cache is gone)."""
    run, md, layers = step
    hidden, caches = run({f"layer.{i}": md for i in range(layers - 1)}, module=run.native)
    assert np.asarray(caches[-1]).size == 0  # the last layer's cache, replaced by []
    assert np.abs(np.asarray(caches[0])).max() > 0
    want_hidden, _ = run(md)
    assert not np.array_equal(np.asarray(hidden), np.asarray(want_hidden))


def test_a_dict_missing_a_layer_is_refused_instead_of_running_that_layer_without_a_cache(step):
    run, md, layers = step
    with pytest.raises(InvalidArgumentError) as e:
        run({f"layer.{i}": md for i in range(layers - 1)})
    assert e.value.argument == "attention_metadata" and f"[{layers - 1}]" in str(e.value)


def test_several_kv_cache_groups_each_write_where_their_own_metadata_says(step):
    """Layer 0 in one KV-cache group, the others in a second with other pages: every layer's K/V is where its own
    metadata says, and the hidden state is the single group's (0.2.5 natively; the backport since issue 35)."""
    run, md, layers = step
    other = paged.PageAllocator(4, 16, reserved=(0, 1))  # the same requests on other pages
    seqs = [paged.SequenceSlice(n, n, other.allocate(s, n), s) for s, n in LENGTHS.items()]
    assert [s.pages for s in seqs] != run.pages
    md2 = paged.build_metadata(seqs, run.layout, max_num_tokens=16, max_num_seqs=2, pages_per_seq=1)
    assert md2.token_order == run.md.token_order  # the same kernel order: the same tokens and positions
    want_hidden, want_caches = run(md)
    hidden, caches = run({"layer.0": md, **{f"layer.{i}": md2.to_attention_metadata() for i in range(1, layers)}})
    _equal(hidden, want_hidden)
    for layer in range(layers):
        pages = run.pages if layer == 0 else [s.pages for s in seqs]
        for i, (rid, n) in enumerate(LENGTHS.items()):
            got = paged.read_kv(caches[layer], run.layout, pages[i], n)
            want = paged.read_kv(want_caches[layer], run.layout, run.pages[i], n)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"layer {layer}, request {rid}")


def test_a_layer_given_the_whole_dict_is_refused(step):
    _, md, _ = step
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    with tiny.mesh_context(cfg, mesh):
        attention = wrap(tiny.tiny_attention(cfg, mesh, model_mode="autoregressive", batch=16, seq=1))
        x = jnp.zeros((16, 1, cfg.emb_dim))
        with pytest.raises(InvalidArgumentError, match="one layer's attention metadata") as e:
            attention(x, x, jnp.zeros((16, 1), jnp.int32), None, model_mode="autoregressive",
                      kv_cache=jnp.zeros((4, 16, 2, 1, 128)), attention_metadata={"layer.0": md})  # fmt: skip
    assert e.value.argument == "attention_metadata"
