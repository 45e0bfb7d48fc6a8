"""The meshes of a backported serving step: tpu-inference's (every op, KV caches) and MaxText 0.1.0's (names).

Why: tpu-inference builds its mesh with its own axis names (`data`/`model`, or the 7 axes of
NEW_MODEL_DESIGN), traces each step under `jax.set_mesh(that mesh)` and shard_maps the RPA kernel
on it; shard_map refuses any other context mesh. MaxText 0.1.0's layers name 0.1.0's axes
(`tensor`, `fsdp`, ...): in their logical-axis rules and, for a few kernels, through the module's
own `mesh`. So the model holds a 0.1.0 mesh over the runner's devices (all on `tensor`), and the
steps run on the runner's mesh with 0.1.0's rules translated (`rules_for`): `tensor` becomes
tpu-inference's head axes, every other 0.1.0 axis (size 1 there) is dropped. Heads end up exactly
where RPA expects them, and one jitted step never mixes two meshes. Tensor parallelism only.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.errors import ServingConfigError

TENSOR_AXIS = "tensor"  # MaxText 0.1.0's tensor-parallel mesh axis


def tensor_parallelism(runner_mesh: Any) -> int:
    """The runner mesh's head-parallel degree; typed error when any other axis is larger than 1."""
    from maxtext_compat.paged.sharding import head_parallelism

    tp = head_parallelism(runner_mesh)
    if tp != runner_mesh.devices.size:
        raise ServingConfigError(
            "the backported vLLM path of MaxText 0.1.0 serves tensor parallelism only",
            argument="--tensor-parallel-size / --data-parallel-size",
            expected="a mesh whose only axes larger than 1 shard attention heads",
            found=f"mesh axes {dict(runner_mesh.shape)}",
            fix="serve with --tensor-parallel-size N and no data/expert/context parallelism",
        )
    return tp


def check_heads(cfg: Any, tp: int) -> None:
    """Query and KV heads must split evenly over `tp` devices (KV heads are padded up to TP beforehand)."""
    q, kv = int(cfg.num_query_heads), int(cfg.num_kv_heads)
    if q % tp or kv % tp:
        raise ServingConfigError(
            "attention heads do not split evenly over the tensor-parallel devices",
            argument="--tensor-parallel-size",
            expected=f"query heads ({q}) and KV heads ({kv}) divisible by {tp}",
            found=f"tensor parallelism {tp}",
            fix="choose a tensor-parallel size that divides the head counts",
        )


def maxtext_mesh(cfg: Any, devices: list[Any]) -> Any:
    """MaxText 0.1.0's mesh (`cfg.mesh_axes`) over `devices`, all of them on the `tensor` axis."""
    import numpy as np
    from jax.sharding import Mesh

    axes = tuple(cfg.mesh_axes)
    if TENSOR_AXIS not in axes:
        raise ServingConfigError(
            f"the MaxText config has no {TENSOR_AXIS!r} mesh axis",
            argument="maxtext_config.mesh_axes",
            expected=f"MaxText 0.1.0's base.yml axes (with {TENSOR_AXIS!r})",
            found=list(axes),
            fix="drop mesh_axes from maxtext_config",
        )
    shape = [len(devices) if a == TENSOR_AXIS else 1 for a in axes]
    grid = np.empty(len(devices), dtype=object)
    grid[:] = list(devices)
    return Mesh(grid.reshape(shape), axes)


def head_axes(mesh: Any) -> tuple[str, ...]:
    """tpu-inference's attention-head axes (ShardingAxisName.ATTN_HEAD) that `mesh` has."""
    from maxtext_compat.paged.sharding import axis_names

    head = axis_names()[1]
    names = (head,) if isinstance(head, str) else tuple(head or ())
    return tuple(a for a in names if a in mesh.shape)


def rules_for(rules: Any, mesh: Any) -> tuple[tuple[str, Any], ...]:
    """MaxText 0.1.0's logical-axis rules for tpu-inference's `mesh` (see the module docstring)."""
    heads = head_axes(mesh)
    target: Any = heads[0] if len(heads) == 1 else (heads or None)
    out: list[tuple[str, Any]] = []
    for logical, physical in rules:
        names = (physical,) if isinstance(physical, str) else tuple(physical or ())
        out.append((logical, target if TENSOR_AXIS in names else None))
    return tuple(out)
