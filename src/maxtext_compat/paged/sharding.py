"""Mesh axes for the paged KV cache: the names tpu-inference's RPA wrapper shards on.

Why ask tpu-inference: `sharded_ragged_paged_attention` shard_maps q/k/v on
`ShardingAxisName.ATTN_HEAD` and the cache on `(ATTN_DATA, None, ATTN_HEAD, None, None)`.
A cache allocated with the same spec enters the kernel without a reshard, and the
tensor-parallel degree the cache layout needs is the product of those head axes. The names
default to ('data', 'model') (tpu-inference's 2D sharding) when tpu-inference is absent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from maxtext_compat.contract import PositiveInt, checked
from maxtext_compat.errors import InvalidArgumentError

if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding

AxisSpec = str | tuple[str, ...] | None
DEFAULT_DATA_AXIS = "data"
DEFAULT_HEAD_AXIS = "model"


def axis_names() -> tuple[AxisSpec, AxisSpec]:
    """(attention data axis, attention head axis) as the installed tpu-inference names them."""
    if importlib.util.find_spec("tpu_inference") is None:
        return DEFAULT_DATA_AXIS, DEFAULT_HEAD_AXIS
    try:
        from tpu_inference.layers.common.sharding import ShardingAxisName
    except ImportError:  # 0.11.x keeps no ShardingAxisName: literal 'model', metadata replicated
        return None, DEFAULT_HEAD_AXIS
    return ShardingAxisName.ATTN_DATA, ShardingAxisName.ATTN_HEAD


def _as_tuple(axes: AxisSpec) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def check_mesh(mesh: Mesh, *, argument: str = "mesh") -> None:
    """The RPA wrapper's specs name these axes; a mesh without them fails deep inside shard_map."""
    data, head = axis_names()
    needed = [a for a in (*_as_tuple(data), *_as_tuple(head))]
    missing = [a for a in needed if a not in mesh.shape]
    if missing:
        raise InvalidArgumentError(
            "the mesh lacks axes that tpu-inference's RPA wrapper shards on",
            argument=argument,
            expected=f"a jax.sharding.Mesh with axes {needed}",
            found=f"axes {dict(mesh.shape)}",
            fix="build the mesh with maxtext_compat.paged.make_mesh(tp), i.e. "
            "Mesh(devices.reshape(1, tp), ('data', 'model'))",
        )


@checked
def head_parallelism(mesh: Mesh) -> int:
    """How many ways KV heads are split: the product of the mesh's head axes."""
    _, head = axis_names()
    return axes_product(mesh, _as_tuple(head))


# A MaxText mesh's axes that shard attention heads (its ici_tensor_* parallelisms and the vLLM path's 'model').
MAXTEXT_HEAD_AXES = ("tensor", "tensor_transpose", "tensor_sequence", "model")


def axes_product(mesh: Any, axes: tuple[str, ...]) -> int:
    """How many ways `axes` of `mesh` split what they shard (an axis the mesh lacks counts 1)."""
    shape = dict(getattr(mesh, "shape", {}) or {})
    n = 1
    for axis in axes:
        n *= int(shape.get(axis, 1))
    return n


def maxtext_head_parallelism(mesh: Any) -> int:
    """How many ways a MaxText mesh splits attention heads."""
    return axes_product(mesh, MAXTEXT_HEAD_AXES)


def kv_cache_spec() -> Any:
    """PartitionSpec of a per-layer cache [pages, page_size, combined heads, packing, lanes]."""
    from jax.sharding import PartitionSpec as P

    data, head = axis_names()
    return P(data, None, head, None, None)


def qkv_spec() -> Any:
    """PartitionSpec of q/k/v [tokens, heads, head_dim] (heads on the model axis)."""
    from jax.sharding import PartitionSpec as P

    data, head = axis_names()
    return P(data, head, None)


@checked
def kv_cache_sharding(mesh: Mesh) -> NamedSharding:
    from jax.sharding import NamedSharding

    check_mesh(mesh)
    return NamedSharding(mesh, kv_cache_spec())


@checked
def qkv_sharding(mesh: Mesh) -> NamedSharding:
    from jax.sharding import NamedSharding

    check_mesh(mesh)
    return NamedSharding(mesh, qkv_spec())


@checked
def make_mesh(tp: PositiveInt = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A ('data', 'model') mesh of shape (1, tp): the layout tpu-inference's 2D sharding expects."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devs = list(jax.devices() if devices is None else devices)
    if tp > len(devs):
        raise InvalidArgumentError(
            "tensor-parallel degree out of range",
            argument="tp",
            expected=f"an int in [1, {len(devs)}] (the visible devices)",
            found=repr(tp),
            fix="on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax",
        )
    return Mesh(np.array(devs[:tp]).reshape(1, tp), (DEFAULT_DATA_AXIS, DEFAULT_HEAD_AXIS))
