"""The attention op of the backport: q/k/v the layer computed -> ragged paged attention -> out.

Why at the op: MaxText 0.1.0's Attention.__call__ computes q/k/v with the family's own
projections, query/key norms, RoPE and query_pre_attn_scalar, then calls
`self.attention_op(query, key, value, ...)`. That call receives exactly what 0.2.x hands to
`forward_serve_vllm`, so intercepting it reuses every family's logic. The scale is already
folded into q (init or query_pre_attn_scalar), hence sm_scale=1.0 as in MaxText 0.2.x.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.backport.session import KVSession
from maxtext_compat.errors import BackportError
from maxtext_compat.kernel import rpa
from maxtext_compat.paged.sharding import MAXTEXT_HEAD_AXES, make_mesh, maxtext_head_parallelism


def rpa_mesh_for(mesh: Any) -> Any:
    """tpu-inference's ('data', 'model') mesh over the devices of a MaxText mesh (tensor parallel only)."""
    tp = maxtext_head_parallelism(mesh)
    if tp != mesh.devices.size:
        other = {a: n for a, n in dict(mesh.shape).items() if n > 1 and a not in MAXTEXT_HEAD_AXES}
        raise BackportError(
            "the backported vLLM path supports tensor parallelism only",
            argument="mesh",
            expected="a mesh whose only axes larger than 1 shard heads (e.g. ici_tensor_parallelism=N)",
            found=f"axes {other}",
            fix="build the model with ici_tensor_parallelism=N and every other ici_* parallelism 1",
        )
    return make_mesh(tp, devices=list(mesh.devices.flat))


def _sliding_window(op: Any) -> int | None:
    kind = getattr(op, "attention_type", None)
    name = getattr(kind, "name", str(kind)).upper()
    if name.endswith("LOCAL_SLIDING"):
        window = int(getattr(op, "sliding_window_size", 0) or 0)
        if window <= 0:
            raise BackportError(
                "a local sliding-window layer has no window size",
                argument="sliding_window_size",
                expected="> 0",
                found=window,
                fix="set sliding_window_size in the MaxText config",
            )
        return window
    return None


def attend(session: KVSession, op: Any, query: Any, key: Any, value: Any, sinks: Any = None) -> Any:
    """RPA for one layer: (B, S, N, H) q and (B, S, K, H) k/v from the layer -> (B, S, N, H) out."""
    index, cache = session.take()
    b, s, n, h = query.shape
    kv_heads = key.shape[2]
    dtype = cache.dtype  # the kernel needs q/k/v in the cache dtype (MaxText 0.2.4+ casts the same way)
    q = query.reshape(b * s, n, h).astype(dtype)
    k = key.reshape(b * s, kv_heads, h).astype(dtype)
    v = value.reshape(b * s, kv_heads, h).astype(dtype)
    soft_cap = getattr(op, "attn_logits_soft_cap", None) or None
    sink = None if sinks is None else sinks.astype("float32")
    out, updated = rpa.ragged_paged_attention(
        q, k, v, cache, session.metadata_of(index),
        mesh=session.rpa_mesh, sm_scale=1.0, sliding_window=_sliding_window(op), soft_cap=soft_cap,
        attention_sink=sink,
    )  # fmt: skip
    session.give(updated)
    return out.reshape(b, s, n, h).astype(query.dtype)
