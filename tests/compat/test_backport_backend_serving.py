"""The backport serving backend (MaxText 0.1.0) without a server: what `MaxTextForCausalLM` calls.

Each served run emulates tpu-inference's runner: a mesh with the runner's axis names (whichever
ShardingAxisName this process uses), per-layer KV caches sharded on it, one jitted step that merges
the model state and calls `forward` + `compute_logits`, a ragged prefill of two prompts and greedy
decode steps. Tokens must equal MaxText 0.1.0's own dense greedy decode of the same checkpoint
(`dense_logits_fn`, train mode, dot-product attention). TP=2 pads the checkpoint's single KV head
to two (repeated), as `vllm serve --tensor-parallel-size 2` does.
Measured on the shared 2-core CPU box: ~16 s per served run (TP=1, TP=2), ~105 s for the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.envs("maxtext-0.1.0-jax011"), pytest.mark.needs_maxtext]

np = pytest.importorskip("numpy")  # the unit env has neither numpy nor jax
jax = pytest.importorskip("jax")

from maxtext_compat.errors import ServingConfigError, WeightsUnavailableError  # noqa: E402
from maxtext_compat.serving.backport_params import fit_params, params_tree  # noqa: E402

PROMPTS: tuple[list[int], ...] = ([1, 5, 7, 9, 11, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
STEPS = 6
PAGE, PAGES, TOKENS = 16, 16, 32
TOL = 1e-4
SERVED_KEYS = (
    "base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "head_dim", "base_mlp_dim",
    "base_num_decoder_layers", "vocab_size", "max_target_length", "max_prefill_predict_length",
    "dtype", "weight_dtype", "matmul_precision",
)  # fmt: skip


# ------------------------------------------------------------------------------------ pure


def test_fit_params_repeats_kv_heads_only() -> None:
    k = np.arange(6, dtype=np.float32).reshape(2, 1, 3)
    got = fit_params(
        {"decoder/layers_0/self_attention/key/kernel": k, "decoder/norm/scale": np.ones(2)},
        {"decoder/layers_0/self_attention/key/kernel": (2, 4, 3), "decoder/norm/scale": (2,)},
    )
    out = got["decoder/layers_0/self_attention/key/kernel"]
    assert out.shape == (2, 4, 3) and all((out[:, h] == k[:, 0]).all() for h in range(4))
    with pytest.raises(WeightsUnavailableError, match="query/kernel"):  # only K/V heads may be repeated
        fit_params({"a/query/kernel": np.ones((2, 1, 3))}, {"a/query/kernel": (2, 2, 3)})
    with pytest.raises(WeightsUnavailableError, match="missing"):
        fit_params({}, {"a/key/kernel": (2, 2, 3)})
    with pytest.raises(WeightsUnavailableError, match="shapes"):  # 3 heads from 2: not an integer factor
        fit_params({"a/key/kernel": np.ones((2, 2, 3))}, {"a/key/kernel": (2, 3, 3)})


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    import tpu_inference  # noqa: F401 - before MaxText (TensorFlow's protobuf aborts tpu_info's forked probe)

    from maxtext_compat import shims
    from maxtext_compat.cpu import rpa as cpu_rpa
    from maxtext_compat.serving.backport_backend import PROFILE, BackportBackend
    from maxtext_compat.testing.tiny import installed_row

    had_rpa, had_profile = cpu_rpa.installed(), shims.installed(PROFILE)
    status = cpu_rpa.install()
    assert status.active, status.reason
    yield BackportBackend(installed_row())
    # Leave the process as found: later tests see MaxText's and tpu-inference's code unpatched.
    if not had_profile:
        shims.uninstall(PROFILE)
    if not had_rpa:
        cpu_rpa.uninstall()


@pytest.fixture(scope="module")
def checkpoint(backend: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    from maxtext_compat.testing.tiny import tiny_config, tiny_mesh

    cfg = tiny_config("default")
    return backend.save_checkpoint(cfg, str(tmp_path_factory.mktemp("bp") / "ckpt"), 0, tiny_mesh(cfg, 1))


@pytest.fixture(scope="module")
def dense(backend: Any, checkpoint: str) -> tuple[Any, list[list[int]]]:
    """MaxText 0.1.0's own logits function and greedy tokens of the checkpoint."""
    from maxtext_compat.decode.greedy import greedy_decode
    from maxtext_compat.testing.tiny import tiny_config, tiny_mesh

    cfg = tiny_config("default", load_parameters_path=checkpoint, enable_checkpointing=True)
    fn = backend.dense_logits_fn(cfg, tiny_mesh(cfg, 1))
    return fn, greedy_decode(fn, PROMPTS, STEPS, length=int(cfg.max_target_length))


def runner_mesh(tp: int, data: int = 1) -> Any:
    """A mesh as tpu-inference builds it: its 7 axes under NEW_MODEL_DESIGN, else ('data', 'model')."""
    from jax.sharding import Mesh

    from maxtext_compat.paged.sharding import axis_names

    devices = np.array(jax.devices()[: tp * data])
    if isinstance(axis_names()[1], tuple):
        from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES

        shape = [{"model": tp, "data": data}.get(a, 1) for a in MESH_AXIS_NAMES]
        return Mesh(devices.reshape(shape), MESH_AXIS_NAMES)
    return Mesh(devices.reshape(data, tp), ("data", "model"))


def served_config(backend: Any, tp: int, **extra: Any) -> Any:
    """The config `MaxTextForCausalLM` builds for `maxtext-compat serve --tiny --tensor-parallel-size tp`."""
    from maxtext_compat.serving.config import padded_kv_heads
    from maxtext_compat.testing.tiny import TINY

    ov: dict[str, Any] = {"model_name": "default", **{k: TINY[k] for k in SERVED_KEYS}}
    ov["base_num_query_heads"] = max(int(ov["base_num_query_heads"]), tp)
    ov["base_num_kv_heads"] = padded_kv_heads(int(ov["base_num_kv_heads"]), tp) or ov["base_num_kv_heads"]
    return backend.load_config({**ov, **extra})


class Runner:
    """tpu-inference's side of a step: pages, metadata in kernel order, one jitted model call."""

    def __init__(self, backend: Any, cfg: Any, mesh: Any, model: Any) -> None:
        from flax import nnx

        from maxtext_compat import paged

        self.paged, self.cfg, self.mesh = paged, cfg, mesh
        self.layout = paged.KVCacheLayout(
            PAGES, PAGE, int(cfg.num_kv_heads), int(cfg.head_dim), "float32", tp=len(mesh.devices.flat)
        )
        self.caches = self.layout.allocate(int(cfg.num_decoder_layers), mesh=mesh)
        self.alloc = paged.PageAllocator(PAGES, PAGE)
        graphdef, self.state = nnx.split(model)

        @jax.jit
        def step(state: Any, caches: list[Any], ids: Any, pos: Any, md: Any) -> tuple[Any, Any]:
            m = nnx.merge(graphdef, state)
            out = backend.forward(m, cfg, mesh, input_ids=ids, positions=pos, kv_caches=caches, attention_metadata=md)
            return out.kv_caches, backend.compute_logits(m, cfg, mesh, out.hidden)

        self.step = step

    def run(self, chunks: list[tuple[int, list[int], int]]) -> np.ndarray:
        """chunks: (sequence id, new tokens, first position) -> logits (tokens in caller order, vocab)."""
        seqs, toks, poss = [], [], []
        for sid, tokens, start in chunks:
            end = start + len(tokens)
            seqs.append(self.paged.SequenceSlice(len(tokens), end, self.alloc.allocate(sid, end), sid))
            toks.append(tokens)
            poss.append(np.arange(start, end))
        md = self.paged.build_metadata(seqs, self.layout, max_num_tokens=TOKENS, max_num_seqs=2, pages_per_seq=4)
        ids = jax.numpy.asarray(md.to_kernel_order(np.concatenate(toks).astype(np.int32)))
        pos = jax.numpy.asarray(md.to_kernel_order(np.concatenate(poss).astype(np.int32)))
        with jax.set_mesh(self.mesh):  # the runner traces and runs every step under its mesh
            self.caches, logits = self.step(self.state, self.caches, ids, pos, md.to_attention_metadata())
        return md.from_kernel_order(np.asarray(logits))


def serve_greedy(runner: Runner) -> tuple[list[list[int]], np.ndarray]:
    """Prefill both prompts in one step, then STEPS - 1 decode steps; (tokens, prefill logits)."""
    seqs = [list(p) for p in PROMPTS]
    logits = runner.run([(i, s, 0) for i, s in enumerate(seqs)])
    prefill = logits
    for step in range(STEPS):
        ends = np.cumsum([1 if step else len(p) for p in PROMPTS]) - 1
        for i, s in enumerate(seqs):
            s.append(int(np.argmax(logits[ends[i]])))
        if step < STEPS - 1:
            logits = runner.run([(i, [s[-1]], len(s) - 1) for i, s in enumerate(seqs)])
    return [s[len(p) :] for s, p in zip(seqs, PROMPTS, strict=True)], prefill


# ------------------------------------------------------------------------------------ served runs


@pytest.mark.parametrize("tp", [1, 2])
def test_served_steps_match_maxtext_dense_decode(backend: Any, checkpoint: str, dense: Any, tp: int) -> None:
    from maxtext_compat import shims

    cfg = served_config(backend, tp, load_parameters_path=checkpoint)
    mesh = runner_mesh(tp)
    with jax.set_mesh(mesh):  # as tpu-inference's model loader builds it
        model = backend.create_model(cfg, mesh, jax.random.PRNGKey(1))
    assert shims.installed("vllm-backport")
    assert dict(model.mesh.shape)["tensor"] == tp  # 0.1.0's layers on 0.1.0's axes, same devices
    key = np.asarray(params_tree(model)["decoder"]["layers_0"]["self_attention"]["key"]["kernel"])
    assert key.shape[1] == tp and all(np.array_equal(key[:, 0], key[:, h]) for h in range(tp))  # KV head repeated

    runner = Runner(backend, cfg, mesh, model)
    tokens, prefill = serve_greedy(runner)
    fn, expected = dense
    full = np.asarray(fn([p + [0] * (int(cfg.max_target_length) - len(p)) for p in PROMPTS]))
    ref = np.concatenate([full[i, : len(p)] for i, p in enumerate(PROMPTS)])
    assert float(np.abs(prefill - ref).max()) <= TOL
    assert tokens == expected
    assert runner.caches[0].sharding.mesh.devices.size == tp  # the caches stay on the runner's mesh


def test_random_weights_follow_the_runner_key_and_embed_matches_the_table(backend: Any) -> None:
    cfg = served_config(backend, 1)
    mesh = runner_mesh(1)
    with jax.set_mesh(mesh):
        a = backend.create_model(cfg, mesh, jax.random.PRNGKey(3))
        b = backend.create_model(cfg, mesh, jax.random.PRNGKey(3))
        c = backend.create_model(cfg, mesh, jax.random.PRNGKey(4))
    table = np.asarray(backend.embedding_table(a, cfg, mesh))
    assert table.shape == (cfg.vocab_size, cfg.emb_dim)
    assert np.array_equal(table, np.asarray(backend.embedding_table(b, cfg, mesh)))
    assert not np.array_equal(table, np.asarray(backend.embedding_table(c, cfg, mesh)))
    ids = jax.numpy.asarray([0, 7, 255], jax.numpy.int32)
    np.testing.assert_allclose(np.asarray(backend.embed(a, cfg, mesh, ids)), table[[0, 7, 255]], rtol=1e-6)


# ------------------------------------------------------------------------------------ refusals


def test_load_config_is_vllm_like_and_refuses_scan_or_another_attention(backend: Any, checkpoint: str) -> None:
    import os

    flags = os.environ.get("XLA_FLAGS")
    cfg = served_config(backend, 1, load_parameters_path=checkpoint)
    assert (cfg.attention, cfg.scan_layers, cfg.enable_checkpointing) == ("vllm_rpa", False, True)
    assert os.environ.get("XLA_FLAGS") == flags
    assert backend.num_layers(cfg) == 2
    with pytest.raises(ServingConfigError, match="scan_layers"):
        served_config(backend, 1, scan_layers=True)
    with pytest.raises(ServingConfigError, match="attention"):
        served_config(backend, 1, attention="dot_product")


def test_check_mesh_refuses_data_parallelism_and_uneven_heads(backend: Any) -> None:
    cfg = served_config(backend, 1)
    with pytest.raises(ServingConfigError, match="tensor parallelism only"):
        backend.check_mesh(cfg, runner_mesh(1, data=2))
    with pytest.raises(ServingConfigError, match="divisible"):  # 2 query heads over 4 devices
        backend.check_mesh(cfg, runner_mesh(4))


def test_a_checkpoint_of_another_model_is_a_typed_error(backend: Any, checkpoint: str) -> None:
    cfg = served_config(backend, 1, load_parameters_path=checkpoint, base_mlp_dim=512)
    mesh = runner_mesh(1)
    with jax.set_mesh(mesh), pytest.raises(WeightsUnavailableError, match="mlp/wi_0/kernel"):
        backend.create_model(cfg, mesh, jax.random.PRNGKey(0))
