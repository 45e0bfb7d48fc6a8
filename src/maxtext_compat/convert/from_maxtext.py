"""A checkpoint MaxText's own trainer wrote -> the model directory `maxtext-compat serve` reads.

    maxtext-compat convert RUN/checkpoints OUT --from-maxtext --set model_name=llama3.1-8b --set ...

Why a conversion and not `load_parameters_path` alone: the trainer saves the whole train state
(`params/params/...`, the optimizer state, the step) with scanned layers by default, while every
release's vLLM path runs an unscanned decoder. Only the parameters are read; they are checked
against the config the model was trained with (given as the same `KEY=VALUE` overrides), key by
key, so a wrong `--set` is refused naming the config key instead of failing deep in a load, then
unscanned and written by the installed release's backend (which checks every path and shape
again) into a staging directory renamed into place only when complete.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxtext_compat.errors import InvalidArgumentError, WeightsMismatchError

ITEMS = "items"
PARAMS_PREFIXES = ("params/params/", "params/")  # a Linen TrainState's collection; a bare params item
# Keys of a training run that say nothing of the model, or that the serving path sets itself.
NOT_SERVED = frozenset({
    "run_name", "steps", "dataset_type", "dataset_path", "per_device_batch_size", "max_target_length",
    "max_prefill_predict_length", "enable_checkpointing", "checkpoint_period", "async_checkpointing",
    "base_output_directory", "skip_jax_distributed_system", "hardware", "jax_cache_dir", "log_config",
    "enable_tensorboard", "metrics_file", "attention", "learning_rate", "warmup_steps_fraction", "opt_type",
    "gradient_clipping_threshold", "load_parameters_path", "load_full_state_path", "scan_layers", "eval_interval",
    "tokenizer_path", "enable_goodput_recording", "monitor_goodput", "gcs_metrics", "save_config_to_gcs",
    "remat_policy", "enable_dropout", "dropout_rate", "data_sharding", "ici_fsdp_parallelism",
    "ici_data_parallelism", "ici_tensor_parallelism", "dcn_data_parallelism", "dcn_fsdp_parallelism",
})  # fmt: skip
_STEP = re.compile(r"^\d+$")


@dataclass(frozen=True)
class TrainedCheckpoint:
    """Where the parameters of one saved step are, and which step it is (None: an items folder given directly)."""

    items: Path
    step: int | None


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings, as MaxText's command line takes them, -> {key: value} (JSON values where they parse:
    numbers, true/false, lists; the text otherwise)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(
                "a config override is not KEY=VALUE",
                argument="--set",
                expected="KEY=VALUE, as MaxText's trainer took it (e.g. base_num_decoder_layers=2)",
                found=repr(pair),
                fix="write each override as KEY=VALUE, one --set each",
            )
        if key in out:
            raise InvalidArgumentError(
                "a config key is given twice", argument="--set", expected="each key once", found=key,
                fix=f"keep one --set {key}=...",
            )  # fmt: skip
        out[key.strip()] = _value(text)
    return out


def _value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return json.loads(text)
    except ValueError:
        return text


def locate(source: str | Path) -> TrainedCheckpoint:
    """The saved step of `source`: a run's `checkpoints` folder (its latest complete step), one step's folder
    (`checkpoints/5`), or that step's `items` folder."""
    path = Path(source)
    if not path.is_dir():
        raise InvalidArgumentError(
            "the MaxText checkpoint folder does not exist",
            argument="source",
            expected="BASE_OUTPUT_DIRECTORY/RUN_NAME/checkpoints, one step's folder in it, or its items folder",
            found=str(path),
            fix="pass the checkpoints folder MaxText's trainer wrote (enable_checkpointing=True)",
        )
    if _is_items(path):
        step = path.parent.name
        return TrainedCheckpoint(path.absolute(), int(step) if _STEP.match(step) else None)
    if _is_items(path / ITEMS):
        return TrainedCheckpoint((path / ITEMS).absolute(), int(path.name) if _STEP.match(path.name) else None)
    steps = sorted(int(p.name) for p in path.iterdir() if _STEP.match(p.name) and _is_items(p / ITEMS))
    if not steps:
        raise InvalidArgumentError(
            "no saved step in the MaxText checkpoint folder",
            argument="source",
            expected="numbered step folders holding a complete items/ checkpoint (orbax), or one of them",
            found=f"{path} with {sorted(p.name for p in path.iterdir())[:8]}",
            fix="pass RUN_NAME/checkpoints after a step was saved (an interrupted save leaves only a tmp folder)",
        )
    return TrainedCheckpoint((path / str(steps[-1]) / ITEMS).absolute(), steps[-1])


def _is_items(path: Path) -> bool:
    """An orbax PyTree checkpoint that finished writing (its metadata file is written last)."""
    return path.is_dir() and (path / "_METADATA").is_file()


def read_params(items: Path) -> dict[str, Any]:
    """The parameters of a saved train state as {path: numpy array} (MaxText names, as stored), nothing else read."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath

    from maxtext_compat.serving.backport_params import flatten

    handler = ocp.PyTreeCheckpointHandler()
    meta = handler.metadata(epath.Path(items))
    tree = getattr(meta, "tree", meta)
    stored = flatten(_as_dict(tree))
    prefix = next((p for p in PARAMS_PREFIXES if any(k.startswith(p) for k in stored)), None)
    if prefix is None:
        raise InvalidArgumentError(
            "the checkpoint holds no parameters where MaxText's trainer saves them",
            argument="source",
            expected=f"a train state with {PARAMS_PREFIXES[0]}... arrays",
            found=f"top-level keys {sorted({k.split('/', 1)[0] for k in stored})}",
            fix="pass a checkpoint MaxText's trainer saved (enable_checkpointing=True), or convert a GGUF / "
            "Hugging Face model without --from-maxtext",
        )
    top = prefix.split("/", 1)[0]
    wanted = {"params": _as_dict(tree)[top]} if top == "params" else _as_dict(tree)
    restore_args = jax.tree.map(lambda _m: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
    with ocp.Checkpointer(handler) as ckptr:
        restored = ckptr.restore(epath.Path(items), args=_partial(ocp, wanted, restore_args))
    flat = flatten(_as_dict(restored))
    return {k[len(prefix) :]: np.asarray(v) for k, v in flat.items() if k.startswith(prefix)}


def _partial(ocp: Any, item: Any, restore_args: Any) -> Any:
    """Restore only `item`'s arrays: `partial_restore` where orbax has it, else its older empty-transforms form."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(ocp.args.PyTreeRestore)}
    if "partial_restore" in fields:
        return ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    return ocp.args.PyTreeRestore(item=item, restore_args=restore_args, transforms={})


def _as_dict(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {str(k): _as_dict(v) for k, v in tree.items()}
    return tree


def _layer_paths(flat: Mapping[str, Any], sub: str) -> list[str]:
    return sorted(p for p in flat if p.startswith("decoder/") and p.endswith(sub))


def check_trained_config(flat: Mapping[str, Any], cfg: Any) -> None:
    """WeightsMismatchError naming the config key when the stored parameters were trained with another value of
    it (scan, layers, widths, heads, vocabulary, tied output head); a layout this cannot read is left to the
    backend's full path-and-shape check."""
    scanned = any(p.startswith("decoder/layers/") for p in flat)
    unscanned = any(re.match(r"decoder/layers_\d+/", p) for p in flat)
    if (scanned or unscanned) and scanned != bool(cfg.scan_layers):
        _refuse([("scan_layers", scanned, bool(cfg.scan_layers), "decoder/layers" if scanned else "decoder/layers_0")])
    found: list[tuple[str, Any, Any, str]] = []  # (key, in the checkpoint, in the config, the path that says so)
    emb = _shape(flat.get("token_embedder/embedding"))
    if len(emb) == 2:
        found += _differs("vocab_size", emb[0], cfg.vocab_size, "token_embedder/embedding")
        found += _differs("base_emb_dim", emb[1], cfg.emb_dim, "token_embedder/embedding")
    tied = "decoder/logits_dense/kernel" not in flat
    if tied != bool(cfg.logits_via_embedding):
        found.append(("logits_via_embedding", tied, bool(cfg.logits_via_embedding), "decoder/logits_dense/kernel"))
    query = _layer_paths(flat, "self_attention/query/kernel")
    if query:
        shape = _shape(flat[query[0]])
        layers = shape[int(cfg.param_scan_axis)] if scanned else len(query)
        found += _differs("base_num_decoder_layers", layers, cfg.num_decoder_layers, query[0])
        found += _differs("base_num_query_heads", shape[-2], cfg.num_query_heads, query[0])
        found += _differs("head_dim", shape[-1], cfg.head_dim, query[0])
    key = _layer_paths(flat, "self_attention/key/kernel")
    if key:
        found += _differs("base_num_kv_heads", _shape(flat[key[0]])[-2], cfg.num_kv_heads, key[0])
    mlp = _layer_paths(flat, "mlp/wi_0/kernel") or _layer_paths(flat, "mlp/wi/kernel")
    if mlp:
        found += _differs("base_mlp_dim", _shape(flat[mlp[0]])[-1], cfg.mlp_dim, mlp[0])
    if found:
        _refuse(found)


def _refuse(found: list[tuple[str, Any, Any, str]]) -> None:
    keys = "; ".join(f"{k}: checkpoint {_cli(f)}, config {_cli(e)} ({path})" for k, f, e, path in found)
    key, in_checkpoint, in_config, _ = found[0]
    raise WeightsMismatchError(
        f"the checkpoint was trained with another config: {keys}",
        mismatched=[(path, (f,), (e,)) for _, f, e, path in found if not isinstance(f, bool)],
        argument=key,
        expected=f"{key}={_cli(in_config)} (the config given)",
        found=f"{key}={_cli(in_checkpoint)} (the checkpoint)",
        fix="pass the overrides the model was trained with: "
        + " ".join(f"--set {k}={_cli(f)}" for k, f, _, _ in found),
    )


def _shape(array: Any) -> tuple[int, ...]:
    return () if array is None else tuple(int(n) for n in array.shape)


def _differs(key: str, found: Any, expected: Any, path: str) -> list[tuple[str, Any, Any, str]]:
    return [] if int(found) == int(expected) else [(key, int(found), int(expected), path)]


def _cli(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def served_overrides(trained: Mapping[str, Any], cfg: Any, weight_dtype: str) -> dict[str, Any]:
    """The MaxText keys `serve` passes on: the training overrides that describe the model, unscanned, in the
    trained activation dtype (config.json's torch_dtype and the KV cache follow it)."""
    out = {k: v for k, v in trained.items() if k not in NOT_SERVED}
    out.setdefault("dtype", str(cfg.dtype))
    out["scan_layers"] = False
    out["weight_dtype"] = weight_dtype
    return out


def _model_sizes(cfg: Any) -> dict[str, Any]:
    """The built config's sizes under the keys config.json is written from (model_dir.hf_config)."""
    return {
        "base_emb_dim": cfg.emb_dim, "base_num_query_heads": cfg.num_query_heads,
        "base_num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "base_mlp_dim": cfg.mlp_dim,
        "base_num_decoder_layers": cfg.num_decoder_layers, "vocab_size": cfg.vocab_size,
        "max_target_length": cfg.max_target_length, "dtype": str(cfg.dtype),
        "normalization_layer_epsilon": float(cfg.normalization_layer_epsilon),
        "logits_via_embedding": bool(cfg.logits_via_embedding),
    }  # fmt: skip


def _tokenizer_files(tokenizer: str | Path | None) -> list[Path]:
    """The tokenizer files to copy, as a model directory's conversion copies them (job.HF_TOKENIZER_FILES)."""
    from maxtext_compat.convert.job import HF_TOKENIZER_FILES, TOKENIZERS

    if tokenizer is None:
        return []
    path = Path(tokenizer)
    files = [path] if path.is_file() else [path / n for n in HF_TOKENIZER_FILES if (path / n).is_file()]
    if not files or not any(f.name in TOKENIZERS for f in files):
        raise InvalidArgumentError(
            "no tokenizer at the given path",
            argument="tokenizer",
            expected="a tokenizer.json / tokenizer.model file, or a folder holding one",
            found=str(path),
            fix="pass the tokenizer the model was trained with, or leave --tokenizer out (prompts as token ids)",
        )
    return files


def convert_trained(
    source: str | Path,
    out: str | Path,
    overrides: Mapping[str, Any],
    *,
    tokenizer: str | Path | None = None,
    weight_dtype: str = "float32",
    force: bool = False,
) -> Any:
    """MaxText's training checkpoint at `source` (trained with `overrides`) -> the model directory `out`; all or
    nothing. Returns a ConversionResult."""
    from maxtext_compat.convert.job import CHECKPOINT_DIR, WEIGHT_DTYPES, ConversionResult, check_out, put_in_place
    from maxtext_compat.convert.vllm_dir import dump
    from maxtext_compat.resolution.installed import installed_row
    from maxtext_compat.serving import param_trees
    from maxtext_compat.serving.backend import backend_for
    from maxtext_compat.serving.model_dir import MAXTEXT_CONFIG, hf_config

    if weight_dtype not in WEIGHT_DTYPES:
        raise InvalidArgumentError(
            "unsupported weight dtype for the checkpoint", argument="weight_dtype",
            expected=f"one of {list(WEIGHT_DTYPES)}", found=repr(weight_dtype), fix="pass float32 or bfloat16",
        )  # fmt: skip
    target = Path(out).absolute()
    check_out(target, Path(source), force)
    tokenizer_files = _tokenizer_files(tokenizer)
    found = locate(source)
    backend = backend_for(installed_row())
    trained = dict(overrides)
    trained_cfg = backend.base_config(trained)
    flat = read_params(found.items)
    check_trained_config(flat, trained_cfg)
    if bool(trained_cfg.scan_layers):
        flat = param_trees.unscan_params(flat, trained_cfg)
    served = served_overrides(trained, trained_cfg, weight_dtype)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        lengths = {k: getattr(trained_cfg, k) for k in ("max_target_length", "max_prefill_predict_length")}
        serving_cfg = backend.base_config({**served, **lengths})
        # the backend loads `flat` into the release's own model first: every path and shape is checked there
        backend.save_checkpoint(serving_cfg, str(staging / CHECKPOINT_DIR), params=flat)
        ckpt_path = str(target / CHECKPOINT_DIR)
        config = hf_config(_model_sizes(trained_cfg))
        config["rope_theta"] = float(trained_cfg.rope_max_timescale)
        dump(staging / "config.json", config)
        dump(staging / "generation_config.json", {})
        dump(staging / MAXTEXT_CONFIG, {**served, "load_parameters_path": ckpt_path})
        for f in tokenizer_files:
            shutil.copy2(f, staging / f.name)
        files = sorted(x.name for x in staging.iterdir())
        put_in_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    step = f" step {found.step}" if found.step is not None else ""
    layout = "unscanned" if trained_cfg.scan_layers else "as saved"
    note = f"MaxText's training checkpoint{step} ({found.items}), {layout}"
    return ConversionResult(str(target), str(source), ckpt_path, {**served, "load_parameters_path": ckpt_path},
                            files, "none", note)  # fmt: skip
