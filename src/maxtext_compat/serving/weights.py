"""Where a served model's weights come from: random (`--load-format dummy`) or a MaxText checkpoint.

Why a plan: MaxText's own adapter falls back to random weights, with a log line, when vLLM is not
in dummy mode and no `load_parameters_path` is given; a server that answers with random weights
while the user expected a checkpoint is a silent failure. Here that is a typed error, and a local
checkpoint path that does not exist is reported before MaxText/orbax fail on it.

Pure Python (unit-tested without jax).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from maxtext_compat.errors import WeightsUnavailableError

# orbax writes one of these into a checkpoint item directory
_ORBAX_MARKERS = ("_METADATA", "_CHECKPOINT_METADATA", "manifest.ocdbt", "_sharding", "checkpoint")


@dataclass(frozen=True)
class WeightPlan:
    kind: Literal["random", "checkpoint"]
    path: str = ""
    reason: str = ""


def _is_remote(path: str) -> bool:
    return "://" in path


def plan(load_format: str, load_parameters_path: str | None) -> WeightPlan:
    """Decide random vs checkpoint for vLLM's `load_format` and MaxText's `load_parameters_path`."""
    path = str(load_parameters_path or "")
    if load_format == "dummy":
        return WeightPlan("random", reason="--load-format dummy")
    if not path:
        raise WeightsUnavailableError(
            "no weights to serve: vLLM is not in dummy mode and maxtext_config has no load_parameters_path",
            argument="maxtext_config.load_parameters_path",
            expected="a MaxText (orbax) checkpoint directory, or --load-format dummy for random weights",
            found=f"load_format={load_format!r}, load_parameters_path={path!r}",
            fix='add "load_parameters_path": "/path/to/checkpoint" to --additional-config\'s maxtext_config, '
            "or pass --load-format dummy",
        )
    if not _is_remote(path):
        if not os.path.isdir(path):
            raise WeightsUnavailableError(
                "the MaxText checkpoint directory does not exist",
                argument="maxtext_config.load_parameters_path",
                expected="an existing orbax checkpoint directory",
                found=path,
                fix="point load_parameters_path at the checkpoint item directory (e.g. .../0/items)",
            )
        names = set(os.listdir(path))
        if not any(m in names for m in _ORBAX_MARKERS):
            raise WeightsUnavailableError(
                "load_parameters_path is a directory but not an orbax checkpoint",
                argument="maxtext_config.load_parameters_path",
                expected=f"a directory holding one of {list(_ORBAX_MARKERS)}",
                found=f"{path} with {sorted(names)[:8]}",
                fix="point it at the checkpoint item directory (often .../<step>/items), not its parent",
            )
    return WeightPlan("checkpoint", path, reason="load_parameters_path")
