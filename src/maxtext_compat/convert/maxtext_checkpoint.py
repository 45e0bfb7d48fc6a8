"""A converted checkpoint written as the installed MaxText release loads it (`load_parameters_path`).

Why through the release's own model: the tree is loaded into the model the release builds from
the config (every path and shape checked, a typed error naming the tensor otherwise) and written
by the serving backend in that release's layout (0.2.x: NNX `{"value": ...}` leaves that
`from_pretrained` restores; 0.1.0: `{"params": {"params": ...}}` that its
`checkpointing.load_params_from_path` restores), so a checkpoint can never be written in a layout
the release does not read. Scanned checkpoints stack the layers along the config's param_scan_axis.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.convert.gguf_gemma3 import Gemma3Checkpoint
from maxtext_compat.convert.maxtext_tree import Checkpoint, maxtext_overrides, to_maxtext
from maxtext_compat.errors import InvalidArgumentError


def checkpoint_overrides(ckpt: Checkpoint, *, scan_layers: bool, weight_dtype: str = "float32") -> dict[str, Any]:
    """The MaxText config keys the checkpoint is written for (and that load it again)."""
    if scan_layers and isinstance(ckpt, Gemma3Checkpoint):
        raise InvalidArgumentError(
            "a scanned Gemma 3 checkpoint is not written here",
            argument="scan_layers",
            expected="False for a Gemma 3 model (MaxText scans it in blocks of 6 layers plus a remainder)",
            found=True,
            fix="convert without --scan-layers (the vLLM paths of every release run unscanned decoders)",
        )
    return {
        **maxtext_overrides(ckpt.shape),
        "scan_layers": scan_layers,
        "weight_dtype": weight_dtype,
        "dtype": "float32",
        "max_target_length": min(ckpt.shape.context_length, 2048),
        "max_prefill_predict_length": min(ckpt.shape.context_length, 2048) // 2,
    }


def write_maxtext_checkpoint(
    ckpt: Checkpoint, path: str, *, scan_layers: bool = False, weight_dtype: str = "float32"
) -> str:
    """Write `ckpt` at `path` for the installed MaxText; returns the `load_parameters_path`."""
    from maxtext_compat.resolution.installed import installed_row
    from maxtext_compat.serving import param_trees
    from maxtext_compat.serving.backend import backend_for

    backend = backend_for(installed_row())
    cfg = backend.base_config(checkpoint_overrides(ckpt, scan_layers=scan_layers, weight_dtype=weight_dtype))
    flat = to_maxtext(ckpt)
    if scan_layers:
        flat = param_trees.scan_params(flat, num_layers=ckpt.shape.layers, scan_axis=int(cfg.param_scan_axis))
    return backend.save_checkpoint(cfg, path, params=flat)
