"""MaxText 0.1.0 parameter checkpoints for the backport serving backend: write, read, fit to the model.

Why our own restore: 0.1.0's loaders (`checkpointing.load_params_from_path`,
`model_creation_utils.create_nnx_model`) restore into the model's own shapes, but a served model
may declare more KV heads than the checkpoint holds (vLLM/tpu-inference repeat KV heads up to
the tensor-parallel degree; see serving.config.padded_kv_heads). So the checkpoint is read in its
own shapes (orbax metadata) and then fitted: equal shapes pass, the KV-head axis of a key/value
kernel is repeated (`jnp.repeat` semantics, as MaxText 0.2.x's `from_pretrained` does), anything
else is a typed error naming the parameter.

Layout: the one 0.1.0's tools read and write, `{"params": {"params": <Linen params>}}` (the
`params` item of a param-only checkpoint); 0.1.0's NNX Transformer has the same parameter tree.
`fit_params` is numpy-only (unit-tested without jax or MaxText).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from maxtext_compat.errors import WeightsUnavailableError

PARAMS = "params"
# Parameters whose head axis may be repeated: the K/V projections of an attention layer.
REPEATABLE = (("key", "kernel"), ("value", "kernel"), ("key", "bias"), ("value", "bias"))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': x}} -> {'a/b': x}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _repeatable(path: str) -> bool:
    return tuple(path.split("/")[-2:]) in REPEATABLE


def fit_params(found: Mapping[str, Any], expected_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """Checkpoint arrays (flat path -> numpy array) reshaped to the model's shapes (flat path -> shape).

    A key/value projection whose head axis is smaller by an integer factor is repeated along
    that axis; every other difference raises WeightsUnavailableError listing what differs.
    """
    import numpy as np

    missing = sorted(set(expected_shapes) - set(found))
    extra = sorted(set(found) - set(expected_shapes))
    bad: list[str] = []
    out: dict[str, Any] = {}
    for path, shape in expected_shapes.items():
        if path not in found:
            continue
        arr = np.asarray(found[path])
        shape = tuple(int(d) for d in shape)
        if arr.shape == shape:
            out[path] = arr
            continue
        axes = [i for i, (a, b) in enumerate(zip(arr.shape, shape, strict=False)) if a != b]
        one_axis = arr.ndim == len(shape) and len(axes) == 1
        if not (_repeatable(path) and one_axis and shape[axes[0]] % arr.shape[axes[0]] == 0):
            bad.append(f"{path}: checkpoint {arr.shape}, model {shape}")
            continue
        out[path] = np.repeat(arr, shape[axes[0]] // arr.shape[axes[0]], axis=axes[0])
    if missing or extra or bad:
        found_text = "; ".join(
            part
            for part in (
                f"missing {missing[:6]}" if missing else "",
                f"unexpected {extra[:6]}" if extra else "",
                f"shapes {bad[:6]}" if bad else "",
            )
            if part
        )
        raise WeightsUnavailableError(
            "the MaxText checkpoint does not fit the served model",
            argument="maxtext_config.load_parameters_path",
            expected="the parameter tree of the configured model (KV heads may be fewer by an integer factor)",
            found=found_text,
            fix="serve with the maxtext_config the checkpoint was written for (sizes, model_name, scan_layers=False)",
        )
    return out


def _tree_metadata(meta: Any) -> Any:
    """The array-metadata tree of an orbax `metadata()` answer (StepMetadata in orbax >= 0.11)."""
    item = getattr(meta, "item_metadata", meta)
    return getattr(item, "tree", item)


def read(path: str, cfg: Any) -> dict[str, Any]:
    """The checkpoint at `path` as a flat path -> numpy array mapping, in its stored shapes."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    if "://" not in path and not os.path.isdir(path):
        raise WeightsUnavailableError(
            "the MaxText checkpoint directory does not exist",
            argument="load_parameters_path",
            expected="an orbax checkpoint directory",
            found=path,
            fix="set load_parameters_path to an existing MaxText (orbax) checkpoint directory (or a gs:// path), "
            "or serve with --load-format dummy for random weights",
        )
    handler = ocp.PyTreeCheckpointHandler(
        use_ocdbt=bool(cfg.checkpoint_storage_use_ocdbt), use_zarr3=bool(cfg.checkpoint_storage_use_zarr3)
    )
    with ocp.Checkpointer(handler) as ckptr:
        tree_meta = _tree_metadata(ckptr.metadata(path))
        restore_args = jax.tree.map(lambda _m: ocp.RestoreArgs(restore_type=np.ndarray), tree_meta)
        restored = ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    return flatten(restored)


def write(tree: Mapping[str, Any], path: str, cfg: Any) -> str:
    """Save a parameter tree in 0.1.0's param-only layout; returns the absolute path."""
    import orbax.checkpoint as ocp

    target = os.path.abspath(path)
    handler = ocp.PyTreeCheckpointHandler(
        use_ocdbt=bool(cfg.checkpoint_storage_use_ocdbt), use_zarr3=bool(cfg.checkpoint_storage_use_zarr3)
    )
    with ocp.Checkpointer(handler) as ckptr:
        ckptr.save(target, args=ocp.args.PyTreeSave({PARAMS: {PARAMS: dict(tree)}}), force=True)
    return target


def restore_into(model: Any, path: str, cfg: Any, sharding: Any) -> None:
    """Load the checkpoint at `path` into `model`'s parameters (KV heads repeated), placed with `sharding`."""
    import jax
    from flax import nnx

    state = nnx.state(model, nnx.Param)
    target = flatten(state.to_pure_dict())
    stored = read(path, cfg)
    prefix = _common_params_prefix(stored, {p.split("/", 1)[0] for p in target})
    stored = {p[len(prefix) :]: a for p, a in stored.items()}
    fitted = fit_params(stored, {p: tuple(a.shape) for p, a in target.items()})
    placed = {p: jax.device_put(a.astype(target[p].dtype), sharding) for p, a in fitted.items()}
    state.replace_by_pure_dict(unflatten(placed))
    nnx.update(model, state)


def _common_params_prefix(stored: Mapping[str, Any], expected_top: set[str]) -> str:
    """'params/params/' (0.1.0's layout), 'params/' or '' — whichever leaves the model's top-level names."""
    prefix = ""
    while PARAMS not in expected_top and stored and all(p.startswith(prefix + PARAMS + "/") for p in stored):
        prefix += PARAMS + "/"
    return prefix


def params_tree(model: Any) -> dict[str, Any]:
    """The model's parameters as a plain nested dict of arrays (what `write` stores)."""
    from flax import nnx

    return nnx.state(model, nnx.Param).to_pure_dict()
