"""Tiny random-weight MaxText models of the installed release, for tests, the demo and users.

Why here: every test that compares a new path with a native one needs the same small,
fast models, built the way each release expects (0.1.0 wants the base.yml in argv; the mesh comes
from `get_mesh_from_config` where it exists, else `create_device_mesh`; 0.2.x `jax.set_mesh`). The recipes below
were measured on CPU: families default (Llama-style), qwen3 (dense) and gemma3.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat import tempdirs
from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.resolution.installed import (
    MaxTextApi as MaxTextApi,  # re-exported: tests reach the release through tiny
)
from maxtext_compat.resolution.installed import api, config_mesh, mesh_context
from maxtext_compat.resolution.installed import installed_row as installed_row
from maxtext_compat.serving.xla_flags import keep_xla_flags

FAMILIES: dict[str, dict[str, Any]] = {
    "default": {"model_name": "default"},
    # The model yml fixes sizes; override_model_config lets the tiny sizes below win.
    "qwen3": {"model_name": "qwen3-0.6b", "override_model_config": True},
    # 5 local-sliding : 1 global layers; a short window makes short tests exercise it.
    "gemma3": {"model_name": "gemma3-4b", "override_model_config": True, "sliding_window_size": 16},
}

TINY: dict[str, Any] = {
    "base_emb_dim": 128,
    "base_num_query_heads": 2,
    "base_num_kv_heads": 1,
    "head_dim": 128,
    "base_mlp_dim": 256,
    "base_num_decoder_layers": 2,
    "vocab_size": 256,
    "max_target_length": 64,
    "max_prefill_predict_length": 32,
    "per_device_batch_size": 1,
    "dtype": "float32",
    "weight_dtype": "float32",
    "matmul_precision": "highest",
    "attention": "dot_product",
    "scan_layers": False,
    "enable_checkpointing": False,
    "run_name": "maxtext_compat_tiny",
    "skip_jax_distributed_system": True,
    "hardware": "cpu",
    "log_config": False,
    "jax_cache_dir": "",
}


tiny_mesh = config_mesh  # the name tests and recipes use


def tiny_config(
    family: str = "default",
    *,
    tp: int = 1,
    scan_layers: bool = False,
    attention: str = "dot_product",
    vllm: bool = False,
    row: MaxTextRow | None = None,
    **overrides: Any,
) -> Any:
    """A MaxText config for a tiny model of `family`, tensor-parallel over `tp` devices.

    vllm=True starts from the release's configs/inference/vllm.yml (what MaxText's own vLLM
    adapter loads) and sets attention="vllm_rpa" (unless attention names another vLLM kernel).
    """
    if family not in FAMILIES:
        raise InvalidArgumentError(
            "unknown model family",
            argument="family",
            expected=f"one of {sorted(FAMILIES)}",
            found=repr(family),
            fix=f"pass family= as one of {sorted(FAMILIES)}",
        )
    a = api(row)
    ov: dict[str, Any] = {**TINY, **FAMILIES[family], "scan_layers": scan_layers, "attention": attention}
    if tp > 1:
        ov["ici_tensor_parallelism"] = tp
        ov["base_num_query_heads"] = max(ov["base_num_query_heads"], tp)
        ov["base_num_kv_heads"] = max(ov["base_num_kv_heads"], tp)
    yml = a.package_dir / a.row.config.base_yml
    if vllm:
        if a.row.config.vllm_yml is None:
            raise InvalidArgumentError(
                f"MaxText {a.row.name} has no vLLM config",
                argument="vllm",
                found=True,
                fix="use vllm=False; the backport (maxtext_compat.adapters) provides the vLLM path for this release",
            )
        yml = a.package_dir / a.row.config.vllm_yml
        ov["attention"] = attention if attention.startswith("vllm_") else "vllm_rpa"
    ov.update(overrides)
    if ov.get("load_parameters_path") and "enable_checkpointing" not in overrides:
        ov["enable_checkpointing"] = True  # pyconfig of 0.1.0-0.2.4 refuses to load a checkpoint otherwise

    def initialize(output_dir: str) -> Any:
        with keep_xla_flags():
            return a.pyconfig.initialize(["maxtext_compat", str(yml)], **{**ov, "base_output_directory": output_dir})

    # MaxText wants an output directory: a given one is the caller's, one made here goes with the config (tempdirs).
    if "base_output_directory" in ov:
        return initialize(ov["base_output_directory"])
    return tempdirs.for_result("maxtext_compat_", initialize)


def tiny_attention(
    cfg: Any,
    mesh: Any,
    *,
    model_mode: str | None = None,
    batch: int = 2,
    seq: int = 16,
    seed: int = 0,
    row: MaxTextRow | None = None,
) -> Any:
    """MaxText's own Attention layer (an NNX module in every release) with tiny shapes."""
    from flax import nnx

    a = api(row)
    Attention = a.cls("attention")
    mode = model_mode if model_mode is not None else a.modes[0]
    with mesh_context(cfg, mesh, row=a.row):
        return Attention(
            config=cfg,
            num_query_heads=cfg.num_query_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            max_target_length=cfg.max_target_length,
            max_prefill_predict_length=cfg.max_prefill_predict_length,
            mesh=mesh,
            attention_kernel=cfg.attention,
            inputs_q_shape=(batch, seq, cfg.emb_dim),
            inputs_kv_shape=(batch, seq, cfg.emb_dim),
            dtype=cfg.dtype,
            weight_dtype=cfg.weight_dtype,
            model_mode=mode,
            rngs=nnx.Rngs(params=seed, dropout=seed + 1),
        )


def tiny_inputs(cfg: Any, *, batch: int = 2, seq: int = 16, seed: int = 1) -> dict[str, Any]:
    """Random hidden states, tokens, positions and segment ids of matching shapes."""
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "x": jax.random.normal(k1, (batch, seq, cfg.emb_dim), jnp.float32),
        "tokens": jax.random.randint(k2, (batch, seq), 0, cfg.vocab_size, dtype=jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq)),
        "segment_ids": jnp.ones((batch, seq), jnp.int32),
    }


def tiny_transformer(
    cfg: Any, mesh: Any, *, model_mode: str | None = None, seed: int = 0, row: MaxTextRow | None = None
) -> Any:
    """MaxText's own NNX Transformer (0.1.0 wraps its Linen Decoder with ToNNX) with random weights."""
    from flax import nnx

    a = api(row)
    Transformer = a.cls("transformer")
    mode = model_mode if model_mode is not None else a.modes[0]
    with mesh_context(cfg, mesh, row=a.row):
        return Transformer(cfg, mesh, quant=None, model_mode=mode, rngs=nnx.Rngs(params=seed, dropout=seed + 1))


def dense_twin(model: Any, config: Any, mesh: Any = None) -> Any:
    """A train-mode Transformer built from `config` (e.g. base.yml, dot_product) holding `model`'s weights.

    Why: on MaxText 0.2.x the paged path needs a vllm.yml config (attention="vllm_rpa"), whose
    model cannot run the dense reference; the two configs have identical parameter trees, so
    the twin gets the same weights (shape-checked, maxtext_compat.serving.param_trees.load_params).
    """
    from maxtext_compat.serving.param_trees import export_params, load_params

    mesh = mesh if mesh is not None else tiny_mesh(config, 1)
    twin = tiny_transformer(config, mesh)
    load_params(twin, export_params(model), where="the dense twin")
    return twin
