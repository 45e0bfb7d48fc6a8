"""A served model's tied output head with its table rounded once (serving_fixes.output_head): the same logits,
bit for bit.

SmolLM2 (the converted checkpoint: real weights) is built by the serving backend as MaxTextForCausalLM builds it
(MaxText 0.2.5 natively, 0.1.0 through the backport). Its `compute_logits` (the rounded copy through the patched
head) is compared element for element with MaxText's own head on the same model and the same hidden states with
the patch taken out (MaxText's `attend_on_embedding` and the model's own embedder: the unmodified path), both
jitted as tpu-inference's runner jits them (the model state's leaves in, logits out). The compiled programs say
why it is faster: MaxText's own head converts the whole 49152 x 576 table on every call, the served one does not
(the time itself is measured by benchmarks/bench_serving.py). The patch's other paths (a bfloat16 query or
product: handed to the original) against the original function directly.
"""

from __future__ import annotations

import re
import types
from typing import Any

import pytest

# make test-extended's (building the served SmolLM2 in-process: ~5 min on 2 cores): make test holds the patched head
# to MaxText's dense decode through every served answer (test_serving_vllm: the same tokens) and to transformers'
# log-softmax (test_serving_conformance: logprobs within 5e-3).
pytestmark = [
    pytest.mark.needs_maxtext,
    pytest.mark.envs("maxtext-0.2.5", "maxtext-0.1.0-jax011"),
    pytest.mark.extended,
]

np = pytest.importorskip("numpy")
jax = pytest.importorskip("jax")
jnp = jax.numpy

from maxtext_compat import shims  # noqa: E402
from maxtext_compat.serving_fixes import output_head  # noqa: E402

MAX_LEN = 64


def _mesh(cfg: Any) -> Any:
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)


@pytest.fixture(scope="module")
def served(smollm2_dir) -> Any:
    """(backend, cfg, mesh, model): SmolLM2 as the server builds it."""
    from maxtext_compat.resolution.installed import installed_row
    from maxtext_compat.serving.backend import backend_for

    backend = backend_for(installed_row())
    overrides = {**smollm2_dir.maxtext_config, "load_parameters_path": smollm2_dir.checkpoint,
                 "max_target_length": MAX_LEN, "max_prefill_predict_length": MAX_LEN - 4}  # fmt: skip
    cfg = backend.load_config(overrides)
    mesh = _mesh(cfg)
    with jax.set_mesh(mesh):
        model = backend.create_model(cfg, mesh, jax.random.PRNGKey(0))
    yield backend, cfg, mesh, model
    shims.uninstall(output_head.PROFILE)  # later tests see MaxText's head unpatched


def _runner_logits(backend: Any, cfg: Any, mesh: Any, model: Any) -> tuple[Any, Any]:
    """compute_logits jitted as tpu-inference's model loader jits it: (fn(leaves, hidden), leaves)."""
    from flax import nnx

    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)

    @jax.jit
    def run(state_leaves: Any, hidden: Any) -> Any:
        m = nnx.merge(graphdef, jax.tree.unflatten(treedef, state_leaves))
        return backend.compute_logits(m, cfg, mesh, hidden)

    return run, leaves


def _table_converts(hlo: str, cfg: Any) -> list[str]:
    shape = rf"\[{int(cfg.vocab_size)},{int(cfg.emb_dim)}\]"
    return re.findall(rf"= (?:bf16|f32){shape}\S* convert\(", hlo)


def test_served_logits_equal_maxtexts_own_head_bit_for_bit(served: Any) -> None:
    backend, cfg, mesh, model = served
    assert cfg.logits_via_embedding and getattr(model, output_head.ATTRIBUTE, None) is not None
    assert shims.installed(output_head.PROFILE)
    fast, leaves = _runner_logits(backend, cfg, mesh, model)
    rng = np.random.default_rng(0)
    hidden = [jnp.asarray(rng.standard_normal((t, int(cfg.emb_dim))).astype(np.float32) * s)
              for t, s in ((1, 1.0), (8, 3.0), (MAX_LEN, 0.5))]  # fmt: skip
    with jax.set_mesh(mesh):
        got = [np.asarray(fast(leaves, h)) for h in hidden]
        fast_hlo = fast.lower(leaves, hidden[1]).compile().as_text()
    shims.uninstall(output_head.PROFILE)  # the unmodified path: MaxText's attend_on_embedding, its own embedder
    try:
        own, leaves = _runner_logits(backend, cfg, mesh, model)
        with jax.set_mesh(mesh):
            want = [np.asarray(own(leaves, h)) for h in hidden]
            own_hlo = own.lower(leaves, hidden[1]).compile().as_text()
    finally:
        output_head.install(backend.row.import_root)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == np.float32 and g.shape == w.shape == (g.shape[0], int(cfg.vocab_size))
        assert np.array_equal(g, w), f"{int((g != w).sum())} of {g.size} logits differ, max {np.abs(g - w).max()}"
    assert _table_converts(own_hlo, cfg), "MaxText's own head no longer converts the table: drop the patch"
    assert not _table_converts(fast_hlo, cfg), _table_converts(fast_hlo, cfg)


def test_the_patch_equals_the_original_and_leaves_it_what_it_does_not_serve(served: Any) -> None:
    """A float32 query and float32 product (what a served float32 model asks) equal the original on the unrounded
    table; a bfloat16 query or product (`attach` keeps no copy for them: XLA may compute a bfloat16 product in
    excess precision) go to the original, with the rounded values."""
    import importlib

    backend, cfg, _, _ = served
    embeddings = importlib.import_module(f"{backend.row.import_root}.layers.embeddings")
    rng = np.random.default_rng(1)
    table = jnp.asarray(rng.standard_normal((512, 64)).astype(np.float32))
    query = jnp.asarray(rng.standard_normal((3, 64)).astype(np.float32))
    rounded = table.astype(jnp.bfloat16).astype(jnp.float32)
    bf16 = query.astype(jnp.bfloat16)
    cases = [(query, "float32", cfg), (bf16, "float32", cfg), (query, "bfloat16", cfg)]

    def attend(q: Any, t: Any, dtype: str, config: Any, mark: bool) -> Any:
        wrap = output_head.RoundedTable if mark else (lambda x: x)
        return np.asarray(jax.jit(lambda q, t: embeddings.attend_on_embedding(q, wrap(t), dtype, config))(q, t))

    got = [attend(q, rounded, dtype, config, True) for q, dtype, config in cases]
    shims.uninstall(output_head.PROFILE)
    try:
        want = [
            attend(q, table if i == 0 else rounded, dtype, config, False) for i, (q, dtype, config) in enumerate(cases)
        ]
    finally:
        output_head.install(backend.row.import_root)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and np.array_equal(g, w), i


def test_nothing_is_kept_for_an_untied_head_or_a_bfloat16_table(served: Any) -> None:
    from flax import nnx

    def stub(dtype: Any) -> Any:
        return types.SimpleNamespace(
            token_embedder=types.SimpleNamespace(embedding=nnx.Variable(jnp.ones((4, 2), dtype)))
        )

    root = served[0].row.import_root

    def cfg(tied: bool, dtype: str = "float32") -> Any:
        return types.SimpleNamespace(logits_via_embedding=tied, dtype=dtype)

    untied, bf16, bf16_activations, tied = stub(jnp.float32), stub(jnp.bfloat16), stub(jnp.float32), stub(jnp.float32)
    assert not output_head.attach(untied, cfg(False), root)
    assert not output_head.attach(bf16, cfg(True), root)
    assert not output_head.attach(bf16_activations, cfg(True, "bfloat16"), root)
    for model in (untied, bf16, bf16_activations):
        assert output_head.embedder(model) is model.token_embedder
    assert output_head.attach(tied, cfg(True), root)
    assert output_head.embedder(tied) is not tied.token_embedder
