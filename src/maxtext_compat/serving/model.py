"""`MaxTextForCausalLM`: one tpu-inference JAX model class for every MaxText release.

Why our own class: MaxText's shipped adapter exists only from 0.2.0, changes its return arity with
its pinned tpu-inference (3-tuple before 0.2.2, 4-tuple after) and, before 0.2.5, assumes
`kv_caches[i]` is decoder layer i. This class implements the interface of the *installed*
tpu-inference (arity from the matrix, runner extras named by `runner_args`, caches mapped through
`layer_name_to_kvcache_index`) and delegates everything release-specific to a `ServingBackend`.

The tpu-inference contract it meets (model_loader / tpu_runner, 0.11.1-0.32.0):
- `__init__(vllm_config, rng_key, mesh)`; `_self_manages_sharding = True` makes tpu-inference
  (>= 0.18) construct it directly under `with mesh:` for dummy weights, so weights are built here;
  otherwise it is built under `nnx.eval_shape` and `load_weights(rng)` restores the checkpoint.
- `__call__(kv_caches, input_ids, attention_metadata, *extras)` -> `(kv_caches, hidden (T, D), [])`
  (tpu-inference < 0.20.0) or `(kv_caches, hidden, [], expert_indices)` (>= 0.20.0).
- `compute_logits(hidden)` -> (T, vocab); `embed_input_ids`, `get_input_embeddings`.
"""

from __future__ import annotations

import logging
from typing import Any

from flax import nnx

from maxtext_compat.errors import ServingError
from maxtext_compat.serving import config as serving_config
from maxtext_compat.serving import runner_args, runtime, weights

# A child of vLLM's logger: the line lands in the server log with vLLM's formatting.
log = logging.getLogger("vllm.maxtext_compat.model")
ARCHITECTURE = "MaxTextForCausalLM"


class MaxTextForCausalLM(nnx.Module):
    """tpu-inference JAX model wrapping the installed MaxText release (see module docstring)."""

    _self_manages_sharding: bool = True
    supports_multimodal: bool = False
    is_text_generation_model: bool = True

    def __init__(self, vllm_config: Any, rng_key: Any, mesh: Any) -> None:
        rt = runtime.current()
        self.vllm_config = vllm_config
        self.mesh = mesh
        self.backend = rt.backend
        self.return_arity = rt.return_arity
        self.maxtext_config = serving_config.build(vllm_config, rt.backend)
        self.num_layers = rt.backend.num_layers(self.maxtext_config)
        rt.backend.check_mesh(self.maxtext_config, mesh)
        self.weight_plan = weights.plan(
            str(vllm_config.load_config.load_format), self.maxtext_config.load_parameters_path
        )
        self.model: Any = None
        log.info(
            "maxtext_compat %s: %s; weights: %s (%s)",
            ARCHITECTURE,
            rt.describe(),
            self.weight_plan.kind,
            self.weight_plan.path or self.weight_plan.reason,
        )
        if self.weight_plan.kind == "random":
            self.load_weights(rng_key)

    def modules(self) -> list[Any]:
        """vLLM's cleanup walks torch modules; there are none."""
        return []

    def load_weights(self, rng_key: Any) -> None:
        """Build the MaxText model with its weights (random or from the checkpoint); once."""
        if self.model is not None:
            return
        model = self.backend.create_model(self.maxtext_config, self.mesh, rng_key)
        self.model = nnx.data(model)

    def _require_model(self) -> Any:
        if self.model is None:
            raise ServingError(
                f"{ARCHITECTURE} was called before its weights were loaded",
                argument="load_weights",
                expected="load_weights(rng) before the first step",
                found="no model",
                fix="this is a tpu-inference loading-order problem; report the tpu-inference version",
            )
        return self.model

    def __call__(
        self, kv_caches: list[Any], input_ids: Any, attention_metadata: Any, *args: Any, **kwargs: Any
    ) -> tuple[Any, ...]:
        extras = runner_args.split_runner_args(args, kwargs)
        model = self._require_model()
        positions = _positions(attention_metadata, extras.input_positions)
        indices = None
        layer_caches = kv_caches
        if kv_caches is not None:
            indices = runner_args.layer_cache_indices(
                extras.layer_name_to_kvcache_index, self.num_layers, len(kv_caches)
            )
            layer_caches = runner_args.gather(kv_caches, indices)
        step = self.backend.forward(
            model,
            self.maxtext_config,
            self.mesh,
            input_ids=input_ids,
            positions=positions,
            kv_caches=layer_caches,
            attention_metadata=attention_metadata,
            inputs_embeds=extras.inputs_embeds,
        )
        new_caches = step.kv_caches if indices is None else runner_args.scatter(kv_caches, step.kv_caches, indices)
        if self.return_arity == 3:
            return new_caches, step.hidden, []
        return new_caches, step.hidden, [], step.expert_indices

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return self(*args, **kwargs)

    def compute_logits(self, hidden_states: Any) -> Any:
        return self.backend.compute_logits(self._require_model(), self.maxtext_config, self.mesh, hidden_states)

    def embed_input_ids(self, input_ids: Any, multimodal_embeddings: Any = None, is_multimodal: Any = None) -> Any:
        if multimodal_embeddings is not None:
            raise ServingError(
                f"{ARCHITECTURE} serves text only",
                argument="multimodal_embeddings",
                expected="None",
                found=type(multimodal_embeddings).__name__,
                fix="send text (token id) prompts",
            )
        return self.backend.embed(self._require_model(), self.maxtext_config, self.mesh, input_ids)

    def get_input_embeddings(self) -> Any:
        return self.backend.embedding_table(self._require_model(), self.maxtext_config, self.mesh)


def _positions(attention_metadata: Any, fallback: Any) -> Any:
    """Token positions (T,): from the metadata (a dict of per-group metadata: its first entry)."""
    md = attention_metadata
    if isinstance(md, dict):
        md = next(iter(md.values()), None)
    positions = getattr(md, "input_positions", None)
    if positions is None:
        positions = fallback
    if positions is None:
        raise ServingError(
            "the runner passed no token positions",
            argument="attention_metadata.input_positions",
            expected="an int32 array (T,)",
            found="None",
            fix="report the tpu-inference version",
        )
    if getattr(positions, "ndim", 1) != 1:
        raise ServingError(
            "multi-axis (M-RoPE) positions are not supported",
            argument="attention_metadata.input_positions",
            expected="shape (T,)",
            found=f"shape {getattr(positions, 'shape', '?')}",
            fix="serve a text-only model without M-RoPE",
        )
    return positions
