"""Serving backend for MaxText releases without a vLLM path (0.1.0), through the backport.

Why this shape: MaxText 0.1.0's own NNX `models.Transformer` runs every serving step, in train
mode (so its own KV-cache variables are skipped, as 0.2.x skips them under vLLM), on (T, 1)
tokens and positions; the `vllm-backport` shim profile routes each layer's attention op to
tpu-inference's ragged paged attention through a `KVSession` and records the pre-norm hidden
state at the output head. Logits come from 0.1.0's own `Decoder._apply_output_head`.

Meshes (serving_mesh.py): the model holds a 0.1.0 mesh over the runner's devices (all on
`tensor`), while every step runs on tpu-inference's own mesh with 0.1.0's logical rules translated
onto it; the RPA calls get that mesh through the session directly (`backport_call` would build a
('data', 'model') mesh, which NEW_MODEL_DESIGN's axis names reject). 0.1.0 on flax 0.12 loses
Linen sharding metadata, so weights are replicated; activations, q/k/v, attention and the KV
caches are head-sharded.

Weights (serving_params.py): random from the runner's key, or 0.1.0's param-only checkpoint
layout with KV heads repeated to the padded count.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from maxtext_compat import names
from maxtext_compat.errors import ServingConfigError, ServingError
from maxtext_compat.serving import backport_mesh as serving_mesh
from maxtext_compat.serving import backport_params as serving_params
from maxtext_compat.serving.backend import StepOutput
from maxtext_compat.serving.nnx_backend import NNXTransformerBackend

PROFILE = names.VLLM_BACKPORT
VLLM_ATTENTION = "vllm_rpa"
# MaxText's configs/inference/vllm.yml of 0.2.x, as far as 0.1.0's base.yml knows the keys; the
# parallelism keys put every device on `tensor` (the only parallelism the backport serves).
SERVING_DEFAULTS: dict[str, Any] = {
    "attention": VLLM_ATTENTION,
    "scan_layers": False,
    "skip_jax_distributed_system": True,
    "override_model_config": True,
    "ici_fsdp_parallelism": 1,
    "ici_tensor_parallelism": -1,
    "run_name": "maxtext_compat_serving",
    "log_config": False,
}


class BackportBackend(NNXTransformerBackend):
    name = "backport"

    # ---------------------------------------------------------------- helpers

    def prepare(self) -> None:
        """Install the `vllm-backport` profile (call rule, RPA hooks, attention="vllm_rpa"); idempotent.

        The serving path calls it too (load_config, create_model), so a backend used without the
        vLLM plugin still never traces a step without the hooks. The test/tool helpers do not:
        they run MaxText's own code, unpatched.
        """
        from maxtext_compat.patching import profiles
        from maxtext_compat.shims import maxtext_profiles

        maxtext_profiles.register()
        profiles.install(PROFILE)

    def _module(self, name: str) -> Any:
        return importlib.import_module(f"{self.row.import_root}.{name}")

    def _train(self) -> str:
        return str(self._module("common_types").MODEL_MODE_TRAIN)

    @contextlib.contextmanager
    def _ctx(self, cfg: Any, mesh: Any) -> Iterator[None]:
        """The mesh every call runs under and 0.1.0's logical-axis rules, written for that mesh.

        On MaxText's own mesh (tools) the rules are the config's. On tpu-inference's mesh (serving)
        they are translated (serving_mesh.rules_for): the runner traces under `jax.set_mesh(its
        mesh)`, and tpu-inference's shard_map refuses any other context mesh.
        """
        from flax.linen import partitioning as nn_partitioning

        rules = cfg.logical_axis_rules
        if tuple(mesh.axis_names) != tuple(cfg.mesh_axes):
            rules = serving_mesh.rules_for(rules, mesh)
        with mesh, nn_partitioning.axis_rules(rules):
            yield

    def _build(self, cfg: Any, model_mesh: Any, rng_key: Any, run_mesh: Any) -> Any:
        """0.1.0's NNX Transformer (train mode) holding `model_mesh`, random weights replicated on `run_mesh`.

        Replicated because 0.1.0 on flax 0.12 has no sharding metadata for its weights; on the mesh
        the steps run on, so one jitted step never mixes two meshes.
        """
        import jax
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec

        mcu = self._module("model_creation_utils")
        train = self._train()

        def make() -> Any:
            return mcu.create_model(cfg, model_mesh, model_mode=train, rngs=nnx.Rngs(params=rng_key, dropout=1))

        with self._ctx(cfg, run_mesh):
            graphdef, _ = nnx.split(nnx.eval_shape(make))
            state = jax.jit(lambda: nnx.state(make()), out_shardings=NamedSharding(run_mesh, PartitionSpec()))()
        return nnx.merge(graphdef, state)

    def _model_with_weights(self, cfg: Any, model_mesh: Any, rng_key: Any, run_mesh: Any) -> Any:
        from jax.sharding import NamedSharding, PartitionSpec

        model = self._build(cfg, model_mesh, rng_key, run_mesh)
        if cfg.load_parameters_path:
            sharding = NamedSharding(run_mesh, PartitionSpec())
            serving_params.restore_into(model, str(cfg.load_parameters_path), cfg, sharding)
        return model

    # ---------------------------------------------------------------- config

    def load_config(self, overrides: dict[str, Any]) -> Any:
        from maxtext_compat.platforms import cpu_only

        self.prepare()  # pyconfig accepts attention="vllm_rpa" only with the shim installed
        values = {**SERVING_DEFAULTS, **overrides}
        # 0.1.0's pyconfig asserts enable_checkpointing whenever a checkpoint is to be loaded.
        values.setdefault("enable_checkpointing", bool(values.get("load_parameters_path")))
        if cpu_only():
            values.setdefault("hardware", "cpu")
        cfg = self._initialize_config(self.row.config.base_yml, values)
        if cfg.attention != VLLM_ATTENTION:
            raise ServingConfigError(
                "the served MaxText config must use the backported vLLM attention",
                argument="maxtext_config.attention",
                expected=repr(VLLM_ATTENTION),
                found=cfg.attention,
                fix="drop `attention` from maxtext_config",
            )
        if cfg.scan_layers:
            raise ServingConfigError(
                "the backported vLLM path needs an unscanned decoder",
                argument="maxtext_config.scan_layers",
                expected="false",
                found=True,
                fix="drop scan_layers from maxtext_config; convert scanned checkpoints with "
                "maxtext_compat.serving.param_trees.unscan_params",
            )
        return cfg

    # ---------------------------------------------------------------- model

    def check_mesh(self, cfg: Any, mesh: Any) -> None:
        serving_mesh.check_heads(cfg, serving_mesh.tensor_parallelism(mesh))

    def create_model(self, cfg: Any, mesh: Any, rng_key: Any) -> Any:
        self.prepare()
        self.check_mesh(cfg, mesh)
        layers_mesh = serving_mesh.maxtext_mesh(cfg, list(mesh.devices.flat))
        return self._round_head_once(self._model_with_weights(cfg, layers_mesh, rng_key, mesh), cfg, mesh)

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
        from maxtext_compat.backport.session import kv_session
        from maxtext_compat.shims import backport_hooks as hooks

        if inputs_embeds is not None:
            self._reject_input_embeddings()
        hooks.ensure_installed(self.row)  # a dict read once installed (vllm-backport, from prepare(), carries them)
        metadata = _one_group(attention_metadata)
        where = f"MaxText {self.row.name} Transformer (backport serving step)"
        # tpu-inference's mesh goes to the session directly: the KV caches live on it, and under
        # NEW_MODEL_DESIGN its axis names are not the ('data', 'model') of backport.rpa_mesh_for.
        with self._ctx(cfg, mesh), kv_session(kv_caches, metadata, mesh, where) as session:
            model(decoder_input_tokens=input_ids[:, None], decoder_positions=positions[:, None], enable_dropout=False)
            session.check_complete()
        if session.hidden is None:
            raise ServingError(
                f"{where} did not reach its output head",
                argument=PROFILE,
                expected="the pre-norm hidden state recorded by the backport hooks",
                found="none",
                fix="check `maxtext-compat doctor`: the vllm-backport profile must be installed",
            )
        hidden = session.hidden
        return StepOutput(hidden.reshape((-1, hidden.shape[-1])), list(session.updated))

    def compute_logits(self, model: Any, cfg: Any, mesh: Any, hidden: Any) -> Any:
        from maxtext_compat.convention.returns import logits_from_hidden
        from maxtext_compat.serving_fixes import output_head

        with self._ctx(cfg, mesh):
            embedder = output_head.embedder(model)
            return logits_from_hidden(model, hidden[:, None, :], self._train(), embedder).squeeze(1)

    # ---------------------------------------------------------------- tools

    def save_checkpoint(
        self, cfg: Any, path: str, seed: int = 0, mesh: Any = None, params: Mapping[str, Any] | None = None
    ) -> str:
        """`cfg`'s model (random weights, or `params`) in 0.1.0's param-only checkpoint layout."""
        import jax
        from jax.sharding import Mesh

        from maxtext_compat.serving import param_trees

        if mesh is None:
            mesh = Mesh(self._module("maxtext_utils").create_device_mesh(cfg), cfg.mesh_axes)
        model = self._build(cfg, mesh, jax.random.PRNGKey(seed), mesh)
        if params is not None:
            param_trees.load_params(model, params, where=f"the MaxText {self.row.name} model of the config")
        return serving_params.write(serving_params.params_tree(model), path, cfg)

    def dense_logits_fn(self, cfg: Any, mesh: Any) -> Callable[[Any], Any]:
        """MaxText 0.1.0's own forward (train mode, its configured attention) over the checkpoint's weights."""
        import jax

        self._require_reference_checkpoint(cfg)
        model = self._model_with_weights(cfg, mesh, jax.random.PRNGKey(0), mesh)
        return self._dense_logits(model, cfg, mesh)


def _one_group(attention_metadata: Any) -> Any:
    """The step's metadata; a dict of per-group metadata must hold one group (all layers attend alike)."""
    if not isinstance(attention_metadata, dict):
        return attention_metadata
    groups = list({id(v): v for v in attention_metadata.values()}.values())
    if len(groups) != 1:
        raise ServingError(
            "the backported vLLM path runs every layer with one attention metadata",
            argument="attention_metadata",
            expected="one KV-cache group",
            found=f"{len(groups)} groups ({sorted(attention_metadata)[:4]})",
            fix="serve a model whose layers share one KV-cache spec (no hybrid sliding-window groups)",
        )
    return groups[0]


LegacyBackend = BackportBackend  # its earlier name, kept for configurations that name it
