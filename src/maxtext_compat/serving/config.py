"""The MaxText config of a served model, derived from vLLM's config the way MaxText's adapter does.

Why: users pass the usual MaxText-on-vLLM flags (`--additional-config '{"maxtext_config": {...}}'`, a model dir
whose config.json names `MaxTextForCausalLM`), and the same flags must work whatever MaxText
release is installed. Like MaxText's own `generate_maxtext_config` (0.2.2+):
- overrides = `additional_config["maxtext_config"]` (a copy: vLLM hashes and shares its config),
- `--load-format dummy` drops `load_parameters_path` (random weights),
- KV heads are padded to the tensor-parallel degree when TP is a multiple of them (vLLM and
  tpu-inference repeat KV heads up to TP), global KV heads likewise.
Beyond MaxText: config.json and the MaxText config are checked against each other (layers, KV
heads, head_dim, vocab) and the KV-cache dtype against MaxText's dtype, so a mismatch is a typed
error at start-up instead of a shape error inside the kernel.

`overrides_from()` and the checks are pure Python (unit-tested without jax).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.errors import ServingConfigError

log = logging.getLogger(__name__)

ADDITIONAL_KEY = "maxtext_config"
# vLLM dtype names -> MaxText dtype names (the KV cache must have MaxText's activation dtype:
# RPA checks kv_cache.dtype == k.dtype, and MaxText casts q/k/v to `dtype`).
_DTYPE_NAMES = {
    "float32": "float32",
    "torch.float32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "float16": "float16",
    "torch.float16": "float16",
    "half": "float16",
}


@dataclass(frozen=True)
class ServingShape:
    """The facts of vLLM's config the MaxText config depends on."""

    load_format: str
    tp: int = 1
    ep: int = 1
    num_kv_heads: int | None = None
    num_global_kv_heads: int | None = None
    additional_config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Overrides:
    values: dict[str, Any]
    notes: tuple[str, ...] = ()


def padded_kv_heads(num_kv_heads: int | None, tp: int) -> int | None:
    """The KV-head count MaxText must use under `tp`-way head sharding, or None to keep it.

    vLLM/tpu-inference replicate KV heads up to TP when TP is a multiple of the head count
    (`get_padded_num_heads`); MaxText's config must then declare that many heads.
    """
    if not num_kv_heads or tp <= 1:
        return None
    if num_kv_heads < tp and tp % num_kv_heads == 0:
        return tp
    return None


def overrides_from(shape: ServingShape) -> Overrides:
    raw = shape.additional_config.get(ADDITIONAL_KEY) if shape.additional_config else None
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ServingConfigError(
            "additional_config['maxtext_config'] must be a JSON object of MaxText config overrides",
            argument="--additional-config",
            expected='{"maxtext_config": {"model_name": ..., ...}}',
            found=type(raw).__name__,
            fix="pass MaxText keys inside the maxtext_config object",
        )
    values = dict(raw)
    notes: list[str] = []
    if shape.load_format == "dummy" and values.get("load_parameters_path"):
        notes.append(f"--load-format dummy: ignoring load_parameters_path={values['load_parameters_path']!r}")
        values["load_parameters_path"] = ""
    kv_tp = shape.tp * shape.ep
    pad = padded_kv_heads(shape.num_kv_heads, kv_tp)
    if pad is not None:
        notes.append(f"padding base_num_kv_heads {shape.num_kv_heads} -> {pad} to match tensor parallelism {kv_tp}")
        values["base_num_kv_heads"] = pad
    gpad = padded_kv_heads(shape.num_global_kv_heads, kv_tp)
    if gpad is not None:
        notes.append(f"padding global_num_kv_heads {shape.num_global_kv_heads} -> {gpad}")
        values["global_num_kv_heads"] = gpad
    return Overrides(values, tuple(notes))


def text_config(hf_config: Any) -> Any:
    return getattr(hf_config, "text_config", None) or hf_config


def shape_of(vllm_config: Any) -> ServingShape:
    """Read the fields `overrides_from` needs from a live VllmConfig."""
    hf = text_config(vllm_config.model_config.hf_config)
    sharding = getattr(vllm_config, "sharding_config", None)
    if sharding is not None:
        tp, ep = int(sharding.tp_size), int(sharding.expert_size)
    else:  # a VllmConfig not built by tpu-inference's platform
        tp, ep = int(vllm_config.parallel_config.tensor_parallel_size), 1
    return ServingShape(
        load_format=str(vllm_config.load_config.load_format),
        tp=tp,
        ep=ep,
        num_kv_heads=getattr(hf, "num_key_value_heads", None),
        num_global_kv_heads=getattr(hf, "num_global_key_value_heads", None),
        additional_config=dict(vllm_config.additional_config or {}),
    )


def dtype_name(value: Any) -> str | None:
    """'float32' / 'bfloat16' / 'float16' for a str, torch, numpy or jax dtype; None if unknown."""
    if value is None:
        return None
    name = value if isinstance(value, str) else getattr(value, "name", None)
    if not isinstance(name, str):
        try:
            import numpy as np

            name = np.dtype(value).name
        except Exception:
            name = str(value)
    text = name.lower()
    return _DTYPE_NAMES.get(text, _DTYPE_NAMES.get(text.replace("torch.", "")))


def check_consistency(
    *,
    maxtext: Mapping[str, Any],
    hf: Mapping[str, Any],
    tp: int,
    cache_dtype: str | None,
) -> None:
    """Typed errors for disagreements tpu-inference would otherwise hit deep inside a step.

    maxtext: num_decoder_layers, num_kv_heads, head_dim, vocab_size, dtype (from the MaxText config).
    hf: num_hidden_layers, num_key_value_heads, head_dim (may be None), vocab_size (from config.json).
    cache_dtype: the KV-cache dtype name tpu-inference allocates (None: unknown, not checked).
    """
    problems: list[str] = []
    if hf.get("num_hidden_layers") is not None and hf["num_hidden_layers"] != maxtext["num_decoder_layers"]:
        problems.append(
            f"layers: config.json num_hidden_layers={hf['num_hidden_layers']}, "
            f"MaxText num_decoder_layers={maxtext['num_decoder_layers']}"
        )
    if hf.get("num_key_value_heads"):
        kv = int(hf["num_key_value_heads"])
        runner_kv = tp if kv < tp else kv  # tpu-inference get_padded_num_heads
        if runner_kv != maxtext["num_kv_heads"]:
            problems.append(
                f"KV heads: the runner allocates {runner_kv} (config.json num_key_value_heads={kv}, TP={tp}), "
                f"MaxText num_kv_heads={maxtext['num_kv_heads']}"
            )
    if hf.get("head_dim") and int(hf["head_dim"]) != maxtext["head_dim"]:
        problems.append(f"head_dim: config.json {hf['head_dim']}, MaxText {maxtext['head_dim']}")
    if hf.get("vocab_size") and int(hf["vocab_size"]) != maxtext["vocab_size"]:
        problems.append(f"vocab: config.json vocab_size={hf['vocab_size']}, MaxText vocab_size={maxtext['vocab_size']}")
    if problems:
        raise ServingConfigError(
            "the model directory's config.json and the MaxText config describe different models",
            argument="config.json / maxtext_config",
            expected="the same layers, KV heads, head_dim and vocabulary",
            found="; ".join(problems),
            fix="write config.json from the MaxText config (`maxtext-compat serve --write-model-dir`), "
            "or fix the maxtext_config overrides",
        )
    mt_dtype = dtype_name(maxtext.get("dtype"))
    if cache_dtype is not None and mt_dtype is not None and cache_dtype != mt_dtype:
        raise ServingConfigError(
            "the KV cache dtype differs from MaxText's activation dtype (the RPA kernel requires them equal)",
            argument="--dtype / maxtext_config.dtype",
            expected=f"KV cache dtype {mt_dtype}",
            found=f"KV cache {cache_dtype}, MaxText dtype {mt_dtype}",
            fix=f"pass --dtype {mt_dtype} to vllm serve, or set maxtext_config.dtype to {cache_dtype}",
        )


def cache_dtype_of(vllm_config: Any) -> str | None:
    """The KV-cache dtype tpu-inference allocates ('auto' means the model dtype)."""
    cache = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    if cache in (None, "auto"):
        return dtype_name(vllm_config.model_config.dtype)
    return dtype_name(cache)


def hf_facts(hf_config: Any) -> dict[str, Any]:
    hf = text_config(hf_config)
    return {
        "num_hidden_layers": getattr(hf, "num_hidden_layers", None),
        "num_key_value_heads": getattr(hf, "num_key_value_heads", None),
        "head_dim": getattr(hf, "head_dim", None),
        "vocab_size": getattr(hf, "vocab_size", None),
    }


def maxtext_facts(cfg: Any) -> dict[str, Any]:
    return {
        "num_decoder_layers": int(cfg.num_decoder_layers),
        "num_kv_heads": int(cfg.num_kv_heads),
        "head_dim": int(cfg.head_dim),
        "vocab_size": int(cfg.vocab_size),
        "dtype": getattr(cfg, "dtype", None),
    }


def build(vllm_config: Any, backend: Any) -> Any:
    """The MaxText config for `vllm_config`, loaded by `backend` and checked against config.json."""
    shape = shape_of(vllm_config)
    ov = overrides_from(shape)
    for note in ov.notes:
        log.info("maxtext_compat: %s", note)
    cfg = backend.load_config(ov.values)
    check_consistency(
        maxtext=maxtext_facts(cfg),
        hf=hf_facts(vllm_config.model_config.hf_config),
        tp=shape.tp * shape.ep,
        cache_dtype=cache_dtype_of(vllm_config),
    )
    return cfg
