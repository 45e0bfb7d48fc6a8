"""The part of serving MaxText's NNX `Transformer` that does not depend on the release's vLLM path.

Why a shared base: the native backend (0.2.x) and the backport backend (0.1.0) differ in how a
serving step reaches ragged paged attention, but both run the same NNX `Transformer` under a
mesh context (`_ctx`), so embedding, pyconfig loading, the input-embeddings refusal and the
dense reference forward are written once here.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
from collections.abc import Callable
from typing import Any, NoReturn

from maxtext_compat import tempdirs
from maxtext_compat.errors import ServingConfigError, ServingError
from maxtext_compat.serving.backend import ServingBackend
from maxtext_compat.serving.xla_flags import keep_xla_flags

# What a config for writing or reading a checkpoint needs on one host (no distributed system, no run logs).
BASE_DEFAULTS: dict[str, Any] = {
    "skip_jax_distributed_system": True,
    "enable_checkpointing": False,
    "run_name": "maxtext_compat_convert",
    "log_config": False,
    "per_device_batch_size": 1,
    "attention": "dot_product",
}


class NNXTransformerBackend(ServingBackend):
    """A backend whose model is MaxText's NNX `Transformer`, every call run under `_ctx(cfg, mesh)`."""

    @abc.abstractmethod
    def _ctx(self, cfg: Any, mesh: Any) -> contextlib.AbstractContextManager[None]:
        """The mesh and logical-axis rules every call on the model runs under."""

    def _initialize_config(self, yml: str, values: dict[str, Any]) -> Any:
        """The release's pyconfig from `yml` (relative to its package) plus `values`, keeping XLA_FLAGS."""
        from maxtext_compat.resolution.probes import package_dir

        root = package_dir(self.row.import_root)
        if root is None:
            raise ServingError(
                f"package {self.row.import_root!r} is not importable", fix="install MaxText in the serving environment"
            )
        pyconfig = importlib.import_module(self.row.config.pyconfig)
        with keep_xla_flags():
            return pyconfig.initialize(["maxtext_compat", str(root / yml)], **values)

    def base_config(self, overrides: dict[str, Any]) -> Any:
        """The release's training/decode config (base.yml) plus `overrides`: what a checkpoint is written for.

        Without a base_output_directory in `overrides`, the config gets a temporary one that goes with it
        (tempdirs: removed when the config is garbage-collected, at exit at the latest)."""
        from maxtext_compat.platforms import cpu_only

        values = {**BASE_DEFAULTS, **overrides}
        if cpu_only():
            values.setdefault("hardware", "cpu")
        if "base_output_directory" in values:
            return self._initialize_config(self.row.config.base_yml, values)
        return tempdirs.for_result(
            "maxtext_compat_",
            lambda path: self._initialize_config(self.row.config.base_yml, {**values, "base_output_directory": path}),
        )

    def _reject_input_embeddings(self) -> NoReturn:
        raise ServingError(
            f"MaxText {self.row.name} cannot take precomputed input embeddings",
            argument="inputs_embeds",
            expected="None",
            found="an array",
            fix="send token ids",
        )

    def embed(self, model: Any, cfg: Any, mesh: Any, input_ids: Any) -> Any:
        with self._ctx(cfg, mesh):
            return model.token_embedder(input_ids)

    def _round_head_once(self, model: Any, cfg: Any, mesh: Any) -> Any:
        """The served model, with a tied output head's table rounded to bfloat16 once here instead of in every
        step's logits (serving_fixes.output_head: same logits, bit for bit); `compute_logits` hands it to the head."""
        from maxtext_compat.serving_fixes import output_head

        with self._ctx(cfg, mesh):
            output_head.attach(model, cfg, self.row.import_root)
        return model

    def embedding_table(self, model: Any, cfg: Any, mesh: Any) -> Any:
        table = model.token_embedder.embedding
        return table.get_value() if hasattr(table, "get_value") else table

    @staticmethod
    def _require_reference_checkpoint(cfg: Any) -> None:
        """The dense reference must run over the weights the server loads, so a checkpoint is required."""
        if not cfg.load_parameters_path:
            raise ServingConfigError(
                "the dense reference needs the checkpoint the server loads",
                argument="load_parameters_path",
                expected="a checkpoint path in the config",
                found="empty",
                fix="build the reference config with load_parameters_path=<checkpoint>",
            )

    def _dense_logits(self, model: Any, cfg: Any, mesh: Any, **call_kwargs: Any) -> Callable[[Any], Any]:
        """f(tokens (B, S) int32) -> logits from `model`'s own jitted forward (one segment, no dropout)."""
        import jax.numpy as jnp
        from flax import nnx

        @nnx.jit
        def run(m: Any, tokens: Any) -> Any:
            b, s = tokens.shape
            pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
            seg = jnp.ones((b, s), jnp.int32)
            return m(tokens, pos, decoder_segment_ids=seg, enable_dropout=False, **call_kwargs)

        def logits(tokens: Any) -> Any:
            with self._ctx(cfg, mesh):
                return run(model, jnp.asarray(tokens, jnp.int32))

        return logits
