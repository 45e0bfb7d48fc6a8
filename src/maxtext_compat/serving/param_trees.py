"""Move a MaxText model's parameters between releases (and from a scanned to an unscanned stack).

Why a flat {path: array} form: measured for the tiny default / qwen3 / gemma3 models, MaxText
0.1.0 (Linen `variables['params']` or its ToNNX Transformer) and 0.2.x (NNX) name and shape
every parameter identically ('token_embedder/embedding', 'decoder/layers_0/self_attention/
query/kernel', ...). So moving weights is an identity map plus a check, and the check is what
matters: a tree saved from a model of another size or family, or from a scanned model, must
fail by naming the paths at fault, not deep inside a trace or, worse, load half the weights.

    flat = export_params(model_010)              # {path: np.ndarray}
    save_params(model_010, "w.npz")              # the same, on disk
    load_params(model_025, load_npz("w.npz"))    # shape-checked, placed with model_025's shardings

`unscan_params` turns a scanned stack (layer axis at `param_scan_axis`; Gemma 3's blocks of
6 layers plus `layers_remainder`) into the unscanned twin's tree: the backported vLLM path of
0.1.0 and MaxText's own vLLM config both run unscanned decoders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError, WeightsMismatchError

SEP = "/"
SHOWN = 8  # paths listed per category in an error message
_LAYER = re.compile(r"layers_(\d+)$")


# ----------------------------------------------------------------------------------------------
# Flattening
# ----------------------------------------------------------------------------------------------


def _is_nnx(obj: Any) -> bool:
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - MaxText always brings flax
        return False
    return isinstance(obj, nnx.Module)


def _leaf_value(value: Any) -> Any:
    """The array inside an nnx Variable / VariableState or a Linen boxed (partitioned) value."""
    if hasattr(value, "get_value"):
        value = value.get_value()
    elif hasattr(value, "value") and not hasattr(value, "shape"):
        value = value.value
    if hasattr(value, "unbox") and not hasattr(value, "shape"):
        value = value.unbox()
    return value


def _walk(tree: Mapping[Any, Any], prefix: tuple[Any, ...], out: dict[tuple[Any, ...], Any]) -> None:
    for key, value in tree.items():
        path = (*prefix, key)
        value = _leaf_value(value)
        if isinstance(value, Mapping):
            _walk(value, path, out)
        else:
            out[path] = value


def _keyed(source: Any) -> dict[tuple[Any, ...], Any]:
    """{key tuple: array} of an NNX module's Params, an nnx.State, or a (nested or flat) mapping."""
    if _is_nnx(source):
        from flax import nnx

        source = nnx.state(source, nnx.Param)
    if hasattr(source, "to_pure_dict"):  # nnx.State
        source = source.to_pure_dict()
    if not isinstance(source, Mapping):
        raise InvalidArgumentTypeError(
            "cannot read parameters from this object",
            argument="source",
            expected="an NNX module, an nnx.State, Linen variables / params, or a {path: array} mapping",
            found=type(source).__name__,
            fix="pass the model itself, nnx.state(model, nnx.Param), Linen `variables`, or a dict of arrays",
        )
    if set(source) == {"params"} and isinstance(source["params"], Mapping):
        source = source["params"]  # Linen `variables`
    out: dict[tuple[Any, ...], Any] = {}
    _walk(source, (), out)
    flat: dict[tuple[Any, ...], Any] = {}
    for key, value in out.items():
        if len(key) == 1 and isinstance(key[0], str) and SEP in key[0]:
            key = tuple(key[0].split(SEP))  # an already flat {path: array} mapping
        flat[key] = value
    return flat


def _path(key: tuple[Any, ...]) -> str:
    return SEP.join(str(k) for k in key)


def flatten_params(source: Any) -> dict[str, Any]:
    """{'a/b/c': array} (device arrays kept as they are) of any parameter source `_keyed` accepts."""
    return {_path(k): v for k, v in _keyed(source).items()}


def export_params(source: Any) -> dict[str, np.ndarray]:
    """Host (numpy) copies of every parameter, keyed by path: what crosses a release boundary."""
    return {path: np.asarray(v) for path, v in flatten_params(source).items()}


def save_params(source: Any, path: str | Path) -> Path:
    """Write export_params(source) to an .npz file (keys are the '/' paths)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = export_params(source)  # Any: numpy's stub reads **arrays as its allow_pickle flag
    with open(path, "wb") as f:  # a file object: np.savez would otherwise append '.npz' to other names
        np.savez(f, **arrays)
    return path


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """{path: array} from save_params' file."""
    with np.load(Path(path), allow_pickle=False) as data:
        return {k: np.asarray(data[k]) for k in data.files}


# ----------------------------------------------------------------------------------------------
# Checking and loading
# ----------------------------------------------------------------------------------------------


def _shown(items: list[Any]) -> str:
    more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(str(i) for i in items[:SHOWN]) + more


def check_params(params: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], *, where: str = "model") -> None:
    """Raise WeightsMismatchError unless `params` has exactly the paths and shapes of `expected`."""
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    mismatched = [
        (p, tuple(np.shape(params[p])), tuple(expected[p]))
        for p in sorted(set(params) & set(expected))
        if tuple(np.shape(params[p])) != tuple(expected[p])
    ]
    if not (missing or extra or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {_shown(missing)}")
    if extra:
        parts.append(f"extra {len(extra)}: {_shown(extra)}")
    if mismatched:
        parts.append(f"shape mismatch {len(mismatched)}: " + _shown([f"{p} {f} != {e}" for p, f, e in mismatched]))
    scanned = any(p.startswith("decoder/layers/") for p in extra) and any(_is_unscanned_layer(p) for p in missing)
    fix = (
        "the tree is scanned and the model is not: convert it with maxtext_compat.serving.param_trees.unscan_params"
        if scanned
        else "build the model with the config the parameters were saved from (sizes, family, scan_layers)"
    )
    raise WeightsMismatchError(
        f"the parameters do not fit {where}: " + "; ".join(parts),
        missing=missing,
        extra=extra,
        mismatched=mismatched,
        argument="params",
        expected=f"{len(expected)} arrays with the model's paths and shapes",
        found=f"{len(params)} arrays",
        fix=fix,
    )


def _is_unscanned_layer(path: str) -> bool:
    parts = path.split(SEP)
    return len(parts) > 1 and parts[0] == "decoder" and _LAYER.match(parts[1]) is not None


def _placed(value: Any, like: Any) -> Any:
    """`value` in `like`'s dtype, on `like`'s devices and sharding when `like` is a jax array."""
    dtype = like.dtype if hasattr(like, "dtype") else np.asarray(like).dtype
    arr = np.asarray(value).astype(dtype)
    sharding = getattr(like, "sharding", None)
    if sharding is None:
        return arr
    import jax

    return jax.device_put(arr, sharding)


def load_params(target: Any, params: Mapping[str, Any], *, where: str | None = None) -> Any:
    """Load a {path: array} tree into `target` after checking paths and shapes.

    target: an NNX module (updated in place and returned; each array takes the existing
    parameter's dtype and sharding, so a TP-sharded model stays sharded) or a nested Linen
    params dict (a new dict of the same structure is returned).
    """
    flat_params = flatten_params(params)
    keyed = _keyed(target)
    expected = {_path(k): tuple(np.shape(v)) for k, v in keyed.items()}
    check_params(flat_params, expected, where=where or type(target).__name__)
    new = {k: _placed(flat_params[_path(k)], v) for k, v in keyed.items()}
    nested = _unflatten(new)
    if _is_nnx(target):
        from flax import nnx

        state = nnx.state(target, nnx.Param)
        state.replace_by_pure_dict(nested)
        nnx.update(target, state)
        return target
    if isinstance(target, Mapping) and set(target) == {"params"}:
        return {"params": nested}
    return nested


def _unflatten(flat: Mapping[tuple[Any, ...], Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in flat.items():
        node = out
        for k in key[:-1]:
            node = node.setdefault(k, {})
        node[key[-1]] = value
    return out


# ----------------------------------------------------------------------------------------------
# Scanned -> unscanned
# ----------------------------------------------------------------------------------------------


def _take(value: Any, index: int, axis: int) -> Any:
    return value[(slice(None),) * axis + (index,)]


def unscan_params(
    params: Any, config: Any = None, *, num_layers: int | None = None, scan_axis: int | None = None
) -> dict[str, Any]:
    """A scanned decoder's parameters -> the unscanned twin's {path: array} tree.

    Handles MaxText's scanned stack `decoder/layers/<sub>/...` (layer i = index i along
    `scan_axis`) and Gemma 3's scanned blocks `decoder/layers/layers_j/...` (block b along
    `scan_axis` -> layer b * block_size + j) plus `decoder/layers_remainder/layers_j` (the last
    layers). config (optional) supplies num_decoder_layers and param_scan_axis (default 1).
    An unscanned tree comes back unchanged. Other scanned layouts (e.g. DeepSeek's
    dense_layers/moe_layers) raise InvalidArgumentError.
    """
    axis = int(scan_axis if scan_axis is not None else getattr(config, "param_scan_axis", 1))
    want = num_layers if num_layers is not None else getattr(config, "num_decoder_layers", None)
    flat = flatten_params(params)
    per_layer: dict[tuple[int, int], dict[str, Any]] = {}
    rest: dict[str, Any] = {}
    remainder: dict[int, dict[str, Any]] = {}
    sizes: set[int] = set()
    block_size = 0
    for path, value in flat.items():
        parts = path.split(SEP)
        if parts[0] != "decoder" or len(parts) < 3 or parts[1] not in ("layers", "layers_remainder"):
            if parts[0] == "decoder" and len(parts) > 2 and parts[1].endswith("_layers"):
                raise InvalidArgumentError(
                    "unscan_params does not know this scanned layout",
                    argument="params",
                    expected="decoder/layers/... (scanned stack) or Gemma 3 blocks decoder/layers/layers_j/...",
                    found=path,
                    fix="unscan this model family by hand or build it with scan_layers=False",
                )
            rest[path] = value
            continue
        if parts[1] == "layers_remainder":
            m = _LAYER.match(parts[2])
            if m is None:
                raise InvalidArgumentError(
                    "unexpected remainder path",
                    argument="params",
                    expected="decoder/layers_remainder/layers_<j>/...",
                    found=path,
                    fix="unscan this model family by hand or build it with scan_layers=False",
                )
            remainder.setdefault(int(m.group(1)), {})[SEP.join(parts[3:])] = value
            continue
        n = np.shape(value)[axis] if len(np.shape(value)) > axis else -1
        if n < 0:
            raise InvalidArgumentError(
                "a scanned parameter has no layer axis at scan_axis",
                argument="scan_axis",
                expected=f"an axis < {len(np.shape(value))} (param_scan_axis of the config)",
                found=f"{path} of shape {tuple(np.shape(value))}, scan_axis={axis}",
                fix="pass the model's config (its param_scan_axis) or the right scan_axis=",
            )
        sizes.add(int(n))
        m = _LAYER.match(parts[2])
        if m is not None:  # Gemma 3 block: layer j of every scanned block
            j = int(m.group(1))
            block_size = max(block_size, j + 1)
            for b in range(n):
                per_layer.setdefault((b, j), {})[SEP.join(parts[3:])] = _take(value, b, axis)
        else:
            for i in range(n):
                per_layer.setdefault((i, 0), {})[SEP.join(parts[2:])] = _take(value, i, axis)
    if len(sizes) > 1:
        raise InvalidArgumentError(
            "scanned parameters disagree on the number of layers along scan_axis",
            argument="scan_axis",
            expected="one size for every decoder/layers/... array",
            found=sorted(sizes),
            fix="pass the config's param_scan_axis",
        )
    scanned_layers = (next(iter(sizes)) * max(block_size, 1)) if sizes else 0
    total = scanned_layers + len(remainder)
    if want is not None and (sizes or remainder) and int(want) != total:
        raise InvalidArgumentError(
            "the scanned tree does not hold the config's number of layers",
            argument="num_layers",
            expected=int(want),
            found=f"{total} ({scanned_layers} scanned + {len(remainder)} remainder)",
            fix="pass the config the parameters were saved with",
        )
    out = dict(rest)
    for (a, j), subtree in per_layer.items():
        index = a * block_size + j if block_size else a
        for sub, value in subtree.items():
            out[f"decoder/layers_{index}/{sub}"] = value
    for j, subtree in remainder.items():
        for sub, value in subtree.items():
            out[f"decoder/layers_{scanned_layers + j}/{sub}"] = value
    return out


def scan_params(params: Mapping[str, Any], *, num_layers: int, scan_axis: int = 1) -> dict[str, np.ndarray]:
    """An unscanned decoder's {path: array} tree -> MaxText's scanned stack `decoder/layers/<sub>`.

    The inverse of `unscan_params` for a plain stack: layer i goes to index i along `scan_axis`
    (the config's param_scan_axis; a 1-D parameter gets its layer axis last when scan_axis is 1).
    Every layer must hold the same sub-paths and shapes, or one error names what differs.
    """
    flat = flatten_params(params)
    per_layer: dict[int, dict[str, Any]] = {}
    out: dict[str, Any] = {}
    for path, value in flat.items():
        parts = path.split(SEP)
        m = _LAYER.match(parts[1]) if parts[0] == "decoder" and len(parts) > 2 else None
        if m is None:
            out[path] = value
        else:
            per_layer.setdefault(int(m.group(1)), {})[SEP.join(parts[2:])] = value
    if sorted(per_layer) != list(range(num_layers)):
        raise InvalidArgumentError(
            "the unscanned tree does not hold layers 0..num_layers-1",
            argument="num_layers",
            expected=f"layers_0 .. layers_{num_layers - 1}",
            found=f"layers {sorted(per_layer)[:6]}{' ...' if len(per_layer) > 6 else ''} ({len(per_layer)})",
            fix="pass the number of decoder layers the tree was built with",
        )
    first = per_layer[0]
    for i, subtree in per_layer.items():
        shapes = {k: np.shape(v) for k, v in subtree.items()}
        want = {k: np.shape(v) for k, v in first.items()}
        if shapes != want:
            diff = sorted(set(shapes.items()) ^ set(want.items()))[:4]
            raise InvalidArgumentError(
                "decoder layers differ in their parameters; a scanned stack needs identical layers",
                argument=f"decoder/layers_{i}",
                expected=f"the sub-paths and shapes of decoder/layers_0 ({len(want)} arrays)",
                found=f"differences {diff}",
                fix="convert with scan_layers=False for a model whose layers differ",
            )
    for sub in first:
        stacked = [np.asarray(per_layer[i][sub]) for i in range(num_layers)]
        out[f"decoder/layers/{sub}"] = np.stack(stacked, axis=min(scan_axis, stacked[0].ndim))
    return out
