"""What tpu-inference's runner hands a JAX model, in every release, and which KV cache is whose.

Why: the runner calls `model(kv_caches, input_ids, attention_metadata, *extras)` positionally and
the extras changed: 0.11.1 passes `(inputs_embeds, layer_map, lora_metadata)`, 0.12.0+ passes
`(inputs_embeds, input_positions, layer_map, lora_metadata, intermediate_tensors, is_first_rank,
is_last_rank)`. The layer map (`tuple(dict.items())` of `"layer.{i}" -> physical cache index`) is
the only extra that is a tuple of (str, int) pairs, so the layout is told apart by that, not by
counting. The physical cache list is not in layer order in general (hybrid caches, KV sharing),
so caches are gathered into layer order through the map and scattered back after the step;
MaxText's own adapter before 0.2.5 assumed `kv_caches[i]` is layer i (MaxText PR #5139).

Pure Python: no jax, so it is unit-tested in the light environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maxtext_compat.errors import ServingError

LAYOUT_0_11 = ("inputs_embeds", "layer_name_to_kvcache_index", "lora_metadata")
LAYOUT_0_12 = (
    "inputs_embeds",
    "input_positions",
    "layer_name_to_kvcache_index",
    "lora_metadata",
    "intermediate_tensors",
    "is_first_rank",
    "is_last_rank",
)
# Keyword arguments the runner may add that carry nothing for a MaxText model when None/False.
IGNORED_WHEN_EMPTY = ("shared_attention_metadata", "spec_step_idx", "_layer_name_to_kv_cache")
LAYER_PREFIX = "layer."


@dataclass(frozen=True)
class RunnerArgs:
    """The runner's extra arguments by name (None when the installed runner does not pass one)."""

    inputs_embeds: Any = None
    input_positions: Any = None
    layer_name_to_kvcache_index: Any = None
    lora_metadata: Any = None
    intermediate_tensors: Any = None
    is_first_rank: Any = None
    is_last_rank: Any = None


def is_layer_map(value: Any) -> bool:
    """A `{name: index}` mapping or its `tuple(items())` form (what the runner passes)."""
    if isinstance(value, Mapping):
        items: Sequence[Any] = list(value.items())
    elif isinstance(value, tuple):
        items = value
    else:
        return False
    return all(
        isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], str) and isinstance(it[1], int) for it in items
    )


def split_runner_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> RunnerArgs:
    """Name the positional extras, whatever tpu-inference release passed them.

    Unknown keyword arguments with a value are an error rather than silently dropped: each
    one means a feature (LoRA, pipeline stages, speculative steps) the model would ignore.
    """
    layout = LAYOUT_0_11 if len(args) >= 2 and is_layer_map(args[1]) else LAYOUT_0_12
    if len(args) > len(layout):
        raise ServingError(
            "the tpu-inference runner passed more positional arguments than any known release",
            argument="MaxTextForCausalLM.__call__",
            expected=f"at most {len(layout)} extras {layout}",
            found=f"{len(args)} extras",
            fix="check that the installed tpu-inference is listed in compat_matrix.yaml (`maxtext-compat doctor`)",
        )
    named: dict[str, Any] = dict(zip(layout, args, strict=False))
    for key, value in kwargs.items():
        if key in LAYOUT_0_12:
            named[key] = value
        elif key in IGNORED_WHEN_EMPTY and value is None:
            continue
        else:
            raise ServingError(
                f"the tpu-inference runner passed keyword {key!r}, which a MaxText model cannot honour",
                argument=key,
                expected=f"one of {sorted(set(LAYOUT_0_12))} or {list(IGNORED_WHEN_EMPTY)} left empty",
                found=type(value).__name__,
                fix="disable the vLLM feature that sends it (speculative decoding, KV sharing)",
            )
    out = RunnerArgs(**named)
    _check_supported(out)
    return out


def _check_supported(a: RunnerArgs) -> None:
    if a.lora_metadata is not None:
        raise ServingError(
            "LoRA requests are not supported by maxtext-compat's MaxTextForCausalLM",
            argument="lora_metadata",
            expected="None",
            found=type(a.lora_metadata).__name__,
            fix="serve without --enable-lora",
        )
    if a.intermediate_tensors is not None or a.is_first_rank is False or a.is_last_rank is False:
        raise ServingError(
            "pipeline parallelism is not supported by maxtext-compat's MaxTextForCausalLM",
            argument="pipeline_parallel_size",
            expected="1",
            found=f"is_first_rank={a.is_first_rank}, is_last_rank={a.is_last_rank}",
            fix="serve with --pipeline-parallel-size 1",
        )


def layer_cache_indices(layer_map: Any, num_layers: int, num_caches: int) -> list[int]:
    """`indices[i]` = position of decoder layer i's cache in the runner's physical list.

    No map: the list must have one cache per layer, in layer order (the runner's positional
    contract). With a map, every `layer.{i}` for i < num_layers must be present and in range.
    """
    if not layer_map:
        if num_caches != num_layers:
            raise ServingError(
                "the runner passed no layer-to-cache map and a KV-cache list of the wrong length",
                argument="kv_caches",
                expected=f"{num_layers} caches (one per decoder layer)",
                found=f"{num_caches}",
                fix="make config.json's num_hidden_layers match the MaxText config's num_decoder_layers",
            )
        return list(range(num_layers))
    items = dict(layer_map)
    by_layer: dict[int, int] = {}
    for name, index in items.items():
        if isinstance(name, str) and name.startswith(LAYER_PREFIX) and name[len(LAYER_PREFIX) :].isdigit():
            by_layer[int(name[len(LAYER_PREFIX) :])] = int(index)
    missing = [i for i in range(num_layers) if i not in by_layer]
    extra = sorted(i for i in by_layer if i >= num_layers)
    if missing or extra:
        raise ServingError(
            "the runner's KV caches do not match the MaxText model's decoder layers",
            argument="layer_name_to_kvcache_index",
            expected=f"layer.0 .. layer.{num_layers - 1}",
            found=f"missing {missing}" + (f", extra {extra}" if extra else ""),
            fix="make config.json's num_hidden_layers match the MaxText config's num_decoder_layers",
        )
    indices = [by_layer[i] for i in range(num_layers)]
    bad = sorted({i for i in indices if not 0 <= i < num_caches})
    if bad:
        raise ServingError(
            "the runner's layer-to-cache map points outside its KV-cache list",
            argument="layer_name_to_kvcache_index",
            expected=f"indices in [0, {num_caches})",
            found=bad,
            fix="report this tpu-inference version: its runner and layer map disagree",
        )
    return indices


def gather(caches: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    """Layer-ordered view of the physical cache list (list indexing only: no XLA ops)."""
    return [caches[i] for i in indices]


def scatter(caches: Sequence[Any], updated: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    """The physical list with each layer's updated cache written back to its slot.

    Same length and order as the runner's list (its donation and out_shardings expect that);
    caches no layer maps to pass through. Layers sharing one cache: the last layer's update wins.
    """
    if len(updated) != len(indices):
        raise ServingError(
            "the MaxText model returned a different number of KV caches than it was given",
            argument="kv_caches",
            expected=f"{len(indices)}",
            found=f"{len(updated)}",
            fix="this is a backend bug: the model must return one cache per decoder layer",
        )
    out = list(caches)
    for layer, slot in enumerate(indices):
        out[slot] = updated[layer]
    return out
