"""A served MaxText model's tied output head, with the embedding table rounded once instead of every step.

Why: MaxText's tied head (`attend_on_embedding`, the same line in every release 0.1.0-0.2.5) multiplies the final
hidden state by `jnp.asarray(table, jnp.bfloat16).T`, so a float32 table is rounded to bfloat16 (and, promoted
against the float32 hidden state, converted back) inside every logits computation. A server computes logits
every decode step and XLA:CPU materialises both conversions over the whole table: for SmolLM2 (49152 x 576)
~70 of the head's ~85 ms, more than the rest of a step's model matmuls (docs/serving.md). The rounded values never
change, so the serving backends round the table once when the weights are loaded (`attach`: a float32 copy whose
values are bfloat16 numbers, kept on the served model) and hand MaxText's own output head (its norm, dropout,
soft cap, everything) a stand-in embedder over that copy (`embedder`), marked `RoundedTable`. The patch of
`attend_on_embedding` (profile `serving-output-head`, through the shims core: reversible, aliases swept)
multiplies a marked table as it is: the very float32 values the original's two conversions produce, so the
logits are equal bit for bit (tests/compat/test_output_head.py); any other table goes to the original untouched.

Costs one more float32 copy of the table (113 MB for SmolLM2). Nothing is done for an untied head
(`logits_via_embedding` false), a bfloat16 table (the original's cast is then free) or activations other than
float32 (the product is then in bfloat16, which XLA:CPU may compute from the unrounded table: allowed excess
precision, so there is no one answer to be equal to).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from maxtext_compat import names
from maxtext_compat.patching import Original, PatchSpec
from maxtext_compat.patching.registry import REGISTRY
from maxtext_compat.patching.shim import Shim

PROFILE = names.SERVING_OUTPUT_HEAD
ATTRIBUTE = "maxtext_compat_rounded_head"  # the rounded copy, an nnx.Variable on the served Transformer
log = logging.getLogger("vllm.maxtext_compat.output_head")


class RoundedTable:
    """An embedding table already rounded to bfloat16 values (float32, so exact for any query dtype)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _StandInEmbedder:
    """What MaxText's head reads a tied table from (`shared_embedding.variables["params"]["embedding"]`, the
    branch every release has for a non-NNX embedder): the rounded copy, marked."""

    def __init__(self, table: RoundedTable) -> None:
        self.variables = {"params": {"embedding": table}}


def _explicit_sharding(config: Any) -> bool:
    mode = getattr(config, "shard_mode", None)
    return str(getattr(mode, "value", mode)).lower() == "explicit"


def _attend_factory(original: Original) -> Callable[..., Any]:
    signature = inspect.signature(original.function)

    def attend_on_embedding(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = signature.bind(*args, **kwargs)
        table = bound.arguments.get("embedding_table")
        if not isinstance(table, RoundedTable):
            return wrapped(*args, **kwargs)
        import jax.numpy as jnp

        config, query = bound.arguments.get("config"), bound.arguments["query"]
        if (
            query.dtype != jnp.float32
            or jnp.dtype(bound.arguments["attend_dtype"]) != jnp.float32
            or getattr(config, "parameter_memory_host_offload", False)
            or (bound.arguments.get("out_sharding") is not None and _explicit_sharding(config))
        ):  # not the served case (`attach` keeps no copy for them): the original does it
            bound.arguments["embedding_table"] = table.value
            return wrapped(*bound.args, **bound.kwargs)
        # The original's jnp.dot promotes (float32 query, bfloat16 table) to float32: the rounded copy's values.
        return jnp.dot(query, table.value.T, preferred_element_type=jnp.float32)

    return attend_on_embedding


class OutputHeadShim(Shim):
    """`attend_on_embedding` multiplies a `RoundedTable` as it is (the decoders bind the name at import, `from
    ...embeddings import attend_on_embedding`: the engine sweeps the package's modules for such aliases)."""

    name = PROFILE
    description = "a served model's tied output head: the table rounded once"
    verified_for = (names.MAXTEXT_RELEASES,)  # attend_on_embedding, the same line in each release

    def __init__(self, import_root: str) -> None:
        self.import_root = import_root

    def specs(self) -> list[PatchSpec]:
        target = f"{self.import_root}.layers.embeddings:attend_on_embedding"
        return [PatchSpec(target, _attend_factory, origin=f"{__name__} (a RoundedTable is multiplied as it is)")]

    def facts(self) -> dict[str, str]:
        return {"import_root": self.import_root}


def install(import_root: str) -> None:
    """Install the patch in this process (idempotent); outside its verified releases only with
    MAXTEXT_COMPAT_FORCE_SHIMS=1 (else ShimRefusedError)."""
    from maxtext_compat.switches import force_shims

    OutputHeadShim(import_root).install(force=force_shims())


def _value(variable: Any) -> Any:
    return variable.get_value() if hasattr(variable, "get_value") else variable.value


def attach(model: Any, cfg: Any, import_root: str) -> bool:
    """Keep a rounded copy of `model`'s tied table on it, for `embedder`; False when there is nothing to gain."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    if not getattr(cfg, "logits_via_embedding", False) or jnp.dtype(getattr(cfg, "dtype", "float32")) != jnp.float32:
        return False  # untied; or activations in another dtype, whose product XLA may compute in excess precision
    table = _value(model.token_embedder.embedding)
    if table.dtype == jnp.bfloat16:
        return False
    install(import_root)
    rounded = jax.jit(lambda t: t.astype(jnp.bfloat16).astype(jnp.float32))(table)  # keeps the table's sharding
    setattr(model, ATTRIBUTE, nnx.Variable(rounded))
    log.info("maxtext_compat: output head: the tied %s table %s rounded to bfloat16 once (%s)",
             table.dtype, tuple(table.shape), PROFILE)  # fmt: skip
    return True


def embedder(model: Any) -> Any:
    """The embedder to hand MaxText's output head: the stand-in over the rounded copy when `attach` kept one
    and the patch is installed in this process, else the model's own (MaxText rounds the table itself)."""
    rounded = getattr(model, ATTRIBUTE, None)
    if rounded is None or PROFILE not in REGISTRY.installed:  # every step: a dict read, not the engine's lock
        return model.token_embedder
    return _StandInEmbedder(RoundedTable(_value(rounded)))
