"""Serving backend for MaxText releases with a native vLLM path (0.2.x).

Why native: from 0.2.0 MaxText's NNX `Transformer` takes `kv_caches=` / `attention_metadata=`
with `attention="vllm_rpa"` and calls tpu-inference's ragged paged attention itself
(`Attention.forward_serve_vllm`). This backend drives that path the way MaxText's own adapter
does (configs/inference/vllm.yml + overrides, tokens and positions as (T, 1), model_mode
"autoregressive", logits through the decoder's output head) without importing the adapter.
Weights go through MaxText's `model_creation_utils.from_pretrained` (random init, or the orbax
checkpoint with KV heads repeated to the padded count), the loader MaxText's adapter uses.
Releases whose loading differs (before 0.2.2) are handled inline; which releases were served for
real, on which tpu-inference, is the compat report's to say (build/compat-report.md), not this file's.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from maxtext_compat.errors import ServingConfigError, ServingError
from maxtext_compat.serving.backend import StepOutput
from maxtext_compat.serving.nnx_backend import NNXTransformerBackend


class NativeBackend(NNXTransformerBackend):
    name = "native"

    # ---------------------------------------------------------------- helpers

    def _common_types(self) -> Any:
        return importlib.import_module("maxtext.common.common_types")

    def _mode(self, which: str) -> str:
        ct = self._common_types()
        return {"ar": ct.MODEL_MODE_AUTOREGRESSIVE, "train": ct.MODEL_MODE_TRAIN}[which]

    @contextlib.contextmanager
    def _ctx(self, cfg: Any, mesh: Any) -> Iterator[None]:
        """The mesh + logical-axis rules MaxText's adapter wraps every call in."""
        from flax.core.spmd import logical_axis_rules

        with mesh, logical_axis_rules(cfg.logical_axis_rules):
            yield

    def _from_pretrained(self, cfg: Any, mesh: Any, model_mode: str, rng_key: Any) -> Any:
        mcu = importlib.import_module("maxtext.utils.model_creation_utils")
        if hasattr(mcu, "from_pretrained"):  # 0.2.2+
            out = mcu.from_pretrained(cfg, mesh=mesh, model_mode=model_mode, rng_key=rng_key)
        else:  # 0.2.0 / 0.2.1: no checkpoint loading in the adapter's path
            if cfg.load_parameters_path:
                raise ServingConfigError(
                    f"MaxText {self.row.name} cannot restore load_parameters_path in its NNX serving path",
                    argument="maxtext_config.load_parameters_path",
                    expected="MaxText >= 0.2.2 for checkpoints",
                    found=cfg.load_parameters_path,
                    fix="serve with --load-format dummy, or upgrade MaxText",
                )
            out = mcu.create_nnx_model(cfg, mesh=mesh, model_mode=model_mode, rng_key=rng_key)
        return out[0] if isinstance(out, tuple) else out

    # ---------------------------------------------------------------- config

    def load_config(self, overrides: dict[str, Any]) -> Any:
        spec = self.row.config
        if spec.vllm_yml is None:
            raise ServingConfigError(
                f"MaxText {self.row.name} ships no vLLM config",
                argument="maxtext",
                expected="a release with configs/inference/vllm.yml",
                found=self.row.name,
                fix="use the backport backend for this release",
            )
        cfg = self._initialize_config(spec.vllm_yml, overrides)
        modes = self.row.vllm.attention_modes if self.row.vllm else ()
        if cfg.attention not in modes:
            raise ServingConfigError(
                "the served MaxText config must use a vLLM attention mode",
                argument="maxtext_config.attention",
                expected=f"one of {list(modes)}",
                found=cfg.attention,
                fix="drop `attention` from maxtext_config (vllm.yml sets vllm_rpa)",
            )
        if cfg.scan_layers:
            raise ServingConfigError(
                "scanned layers are not supported on MaxText's vLLM path",
                argument="maxtext_config.scan_layers",
                expected="false (vllm.yml's value)",
                found=True,
                fix="drop scan_layers from maxtext_config",
            )
        return cfg

    # ---------------------------------------------------------------- model

    def check_mesh(self, cfg: Any, mesh: Any) -> None:
        """MaxText shards with its config's mesh axes; tpu-inference builds them only with NEW_MODEL_DESIGN=1."""
        missing = [a for a in cfg.mesh_axes if a not in mesh.shape]
        if missing:
            raise ServingConfigError(
                "tpu-inference built a mesh without the axes MaxText's vLLM config shards on",
                argument="NEW_MODEL_DESIGN",
                expected=f"mesh axes {list(cfg.mesh_axes)} (tpu-inference's new-model-design mesh)",
                found=f"mesh axes {list(mesh.shape)}",
                fix="set NEW_MODEL_DESIGN=1 in the environment of `vllm serve` (`maxtext-compat serve` does)",
            )

    def create_model(self, cfg: Any, mesh: Any, rng_key: Any) -> Any:
        with self._ctx(cfg, mesh):
            model = self._from_pretrained(cfg, mesh, self._mode("ar"), rng_key)
        return self._round_head_once(model, cfg, mesh)

    def forward(
        self,
        model: Any,
        cfg: Any,
        mesh: Any,
        *,
        input_ids: Any,
        positions: Any,
        kv_caches: list[Any],
        attention_metadata: Any,
        inputs_embeds: Any = None,
    ) -> StepOutput:
        import jax.numpy as jnp

        kwargs: dict[str, Any] = {
            "decoder_positions": jnp.expand_dims(positions, axis=1),  # (T, 1): tokens are the batch
            "kv_caches": kv_caches,
            "attention_metadata": attention_metadata,
            "model_mode": self._mode("ar"),
        }
        if inputs_embeds is not None:
            if "decoder_input_embeddings" not in inspect.signature(type(model).__call__).parameters:
                self._reject_input_embeddings()
            kwargs["decoder_input_embeddings"] = inputs_embeds[:, None, :].astype(cfg.dtype)
            kwargs["decoder_input_tokens"] = jnp.zeros((inputs_embeds.shape[0], 1), jnp.int32)
        else:
            kwargs["decoder_input_tokens"] = jnp.expand_dims(input_ids, axis=1)
        with self._ctx(cfg, mesh):
            out = model(**kwargs)
        # Transformer in vLLM mode: (hidden, kv_caches), plus expert_indices (0.2.5) for MoE routing.
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise ServingError(
                f"MaxText {self.row.name}'s Transformer did not return its vLLM-mode tuple",
                argument="Transformer.__call__",
                expected="(hidden, kv_caches) or (hidden, kv_caches, expert_indices)",
                found=type(out).__name__ if not isinstance(out, tuple) else f"a {len(out)}-tuple",
                fix=f"check that the config's attention is a vLLM mode ({cfg.attention})",
            )
        hidden, new_caches = out[0], out[1]
        experts = out[2] if len(out) == 3 else None
        return StepOutput(hidden.reshape((-1, hidden.shape[-1])), list(new_caches), experts)

    def compute_logits(self, model: Any, cfg: Any, mesh: Any, hidden: Any) -> Any:
        import jax.numpy as jnp

        from maxtext_compat.serving_fixes import output_head

        with self._ctx(cfg, mesh):
            y = jnp.expand_dims(hidden, axis=1)
            logits = model.decoder.apply_output_head(output_head.embedder(model), y, True, self._mode("ar"))
            return logits.squeeze(1)

    # ---------------------------------------------------------------- tools

    def save_checkpoint(
        self, cfg: Any, path: str, seed: int = 0, mesh: Any = None, params: Mapping[str, Any] | None = None
    ) -> str:
        """`cfg`'s model (random weights, or `params`), written in the NNX layout `from_pretrained` restores."""
        import jax
        import orbax.checkpoint as ocp
        from flax import nnx

        from maxtext_compat.serving import param_trees

        if mesh is None:
            mesh = importlib.import_module("maxtext.utils.maxtext_utils").get_mesh_from_config(cfg)
        with self._ctx(cfg, mesh):
            model = self._from_pretrained(cfg, mesh, self._mode("train"), jax.random.PRNGKey(seed))
            if params is not None:
                param_trees.load_params(model, params, where=f"the MaxText {self.row.name} model of the config")
        transient = (nnx.RngState, nnx.Cache, nnx.Intermediate, nnx.BatchStat)
        params = nnx.state(model).filter(lambda _path, var: not isinstance(var, transient))
        tree = jax.tree.map(lambda v: {"value": v.get_value()}, params, is_leaf=lambda n: isinstance(n, nnx.Variable))
        tree = _to_dict(tree)
        handler = ocp.PyTreeCheckpointHandler(
            use_ocdbt=cfg.checkpoint_storage_use_ocdbt, use_zarr3=cfg.checkpoint_storage_use_zarr3
        )
        with ocp.Checkpointer(handler) as ckptr:
            ckptr.save(
                os.path.abspath(path),
                args=ocp.args.PyTreeSave(tree),
                force=True,
                custom_metadata={"scan_layers": bool(cfg.scan_layers)},
            )
        return os.path.abspath(path)

    def dense_logits_fn(self, cfg: Any, mesh: Any) -> Callable[[Any], Any]:
        """MaxText's own non-vLLM forward (train mode) over `cfg.load_parameters_path`'s weights."""
        import jax

        self._require_reference_checkpoint(cfg)
        train = self._mode("train")
        with self._ctx(cfg, mesh):
            model = self._from_pretrained(cfg, mesh, train, jax.random.PRNGKey(0))
        return self._dense_logits(model, cfg, mesh, model_mode=train)


def _to_dict(tree: Any) -> Any:
    """nnx.State (and nested mappings) -> plain dicts with string keys, as orbax stores them."""
    if hasattr(tree, "items"):
        return {str(k): _to_dict(v) for k, v in tree.items()}
    return tree
