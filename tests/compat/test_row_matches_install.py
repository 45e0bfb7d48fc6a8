"""In each real environment: the resolved matrix row agrees with the installed MaxText.

Checks the import root, the signature of Attention.__call__ (static and imported), and
the return convention on a tiny real call — the facts the adapters and shims rely on.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import warnings

import pytest

from maxtext_compat import resolve
from maxtext_compat.resolution.probes import probe_runtime, probe_static
from maxtext_compat.testing import tiny

pytestmark = pytest.mark.needs_maxtext


@pytest.fixture(scope="module")
def resolution():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact row: no "nearest row" warning allowed here
        return resolve(strict=True)


def test_row_is_the_installed_release(resolution):
    assert resolution.maxtext is not None
    assert resolution.maxtext.name == importlib.metadata.version("maxtext")
    assert resolution.maxtext_match == "exact"


def test_static_probe_agrees(resolution):
    report = probe_static(resolution.maxtext)
    assert report.ok, report.mismatches
    assert report.import_root == resolution.maxtext.import_root


def test_runtime_probe_agrees(resolution):
    report = probe_runtime(resolution.maxtext)
    assert report.ok, report.mismatches


def test_attention_signature_matches_the_row(resolution):
    row = resolution.maxtext
    Attention = row.classes["attention"].load()
    params = inspect.signature(Attention.__call__).parameters
    for name in ("kv_cache", "attention_metadata", "page_state", "out_sharding", "rope_kwargs", "shared_key"):
        assert (name in params) == (name in row.params.attention), name


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011")  # the envs that install tpu-inference
def test_attention_metadata_fields_match_the_tpu_inference_row(resolution):
    """The installed AttentionMetadata's pytree data fields and static (meta) fields are the row's."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from maxtext_compat.resolution.installed_kernel import attention_metadata_class

    row = resolution.tpu_inference
    assert row is not None
    cls = attention_metadata_class(row)
    assert [f.name for f in dataclasses.fields(cls)] == [*row.metadata.fields, *row.metadata.meta_fields]
    md = cls(**{name: jnp.zeros(1, jnp.int32) for name in row.metadata.fields})  # every data field a leaf
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(md)[0]]
    assert [p[0].name for p in paths] == list(row.metadata.fields)  # meta fields are static, not leaves


def test_tiny_attention_call_returns_the_row_convention(resolution):
    import jax

    row = resolution.maxtext
    cfg = tiny.tiny_config(row=row)
    mesh = tiny.tiny_mesh(cfg, row=row)
    attn = tiny.tiny_attention(cfg, mesh, row=row)
    inputs = tiny.tiny_inputs(cfg)
    train = tiny.api(row).modes[0]

    from flax import nnx

    @nnx.jit
    def call(m, x, pos, seg):
        return m(x, x, pos, seg, model_mode=train, deterministic=True)

    with tiny.mesh_context(cfg, mesh, row=row):
        out = call(attn, inputs["x"], inputs["positions"], inputs["segment_ids"])
    if row.returns["attention"] == "out":
        assert isinstance(out, jax.Array) and out.shape == inputs["x"].shape
    else:
        assert isinstance(out, tuple) and len(out) == 2
        assert out[0].shape == inputs["x"].shape and out[1] is None  # no cache given: kv_cache comes back None
