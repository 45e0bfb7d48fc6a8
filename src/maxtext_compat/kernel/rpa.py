"""One call for tpu-inference's ragged paged attention, whatever form the installed release uses.

Why: tpu-inference changed `sharded_ragged_paged_attention` from a curried factory in
`layers.jax` (0.11.x) to a flat function in `layers.common` (0.12+) and then kept adding
keyword arguments (update_kv_cache 0.22.0, use_causal_mask 0.25, attn_logits_soft_cap 0.27).
The compat matrix records each form; this module reads the row of the installed release,
validates the inputs before the kernel sees them, and makes exactly the call that release
accepts. Asking for a feature the release lacks is a typed error naming the release and the
first one that has it, never a silently dropped argument.

On a CPU backend the kernel only runs in Pallas TPU interpret mode: the dispatcher enters the interpret
mode the CPU stand-in installed (`kernel.interpret`; `maxtext_compat.cpu.rpa.install()` sets it) around its
trace and refuses (typed error) when none is installed.

Importing this module imports neither jax nor tpu-inference; the first call does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maxtext_compat.contract import Array, checked
from maxtext_compat.errors import KernelUnavailableError
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import TpuInferenceRow
from maxtext_compat.paged.checks import Scale, SoftCap, Window
from maxtext_compat.paged.metadata import Metadata, metadata_arrays
from maxtext_compat.resolution.installed_kernel import (
    entry_point,
    first_release_with,
    installed_rpa,
    row_label,
)

if TYPE_CHECKING:
    from jax.sharding import Mesh

__all__ = ["ragged_paged_attention"]

# Values the dispatcher can fill, by the parameter names the matrix uses.
FILLABLE = frozenset(
    {
        "mesh", "q", "k", "v", "kv_cache", "kv_lens", "page_indices", "cu_q_lens", "distribution",
        "attention_sink", "sm_scale", "attention_chunk_size", "q_scale", "k_scale", "v_scale",
        "update_kv_cache", "use_causal_mask", "attn_logits_soft_cap",
    }
)  # fmt: skip
# Values that are features: a non-default value needs the release to take the parameter.
DEFAULTS: dict[str, Any] = {
    "attention_sink": None,
    "attention_chunk_size": None,
    "q_scale": None,
    "k_scale": None,
    "v_scale": None,
    "update_kv_cache": True,
    "use_causal_mask": True,
    "attn_logits_soft_cap": None,
}
USER_NAMES = {"attention_chunk_size": "sliding_window", "attn_logits_soft_cap": "soft_cap"}


# --------------------------------------------------------------------------------------------
# The call a row wants (pure python: unit-tested against a fake entry point for every row)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RpaCall:
    """The exact call to make: factory args (curried form only), positional args and kwargs."""

    form: str
    factory_args: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    swap_returns: bool


def check_features(row: TpuInferenceRow, values: Mapping[str, Any], *, label: str | None = None) -> None:
    """Typed error for a non-default feature value (sink, soft cap, ...) the release does not take."""
    rpa = row.rpa
    label = label or row_label(row)
    takes = {*rpa.factory_params, *rpa.params, *rpa.optional_kwargs}
    for name, default in DEFAULTS.items():
        value = values.get(name, default)
        if name not in takes and not _is_default(value, default):
            since = first_release_with(name)
            user = USER_NAMES.get(name, name)
            raise KernelUnavailableError(
                f"{label} does not support {user}",
                argument=user,
                expected=f"{user}={default!r} with this release",
                found=f"{user}={value!r}",
                fix=f"upgrade to tpu-inference >= {since}" if since else "drop the argument",
            )


def plan_call(row: TpuInferenceRow, values: Mapping[str, Any], *, label: str | None = None) -> RpaCall:
    """Map named values onto the row's parameters; typed error for a feature the release lacks."""
    check_features(row, values, label=label)
    rpa = row.rpa
    unknown = [p for p in (*rpa.factory_params, *rpa.params) if p not in FILLABLE]
    if unknown:
        raise KernelUnavailableError(
            "the matrix row names RPA parameters the dispatcher cannot fill",
            argument="compat_matrix.yaml",
            expected=f"parameters among {sorted(FILLABLE)}",
            found=unknown,
            fix="teach maxtext_compat.kernel.rpa the new parameter",
        )

    def get(name: str) -> Any:
        return values[name] if name in values else DEFAULTS[name]

    if rpa.call_form == "curried":
        factory = tuple(get(p) for p in rpa.factory_params)
        args = tuple(get(p) for p in rpa.params)
        kwargs: dict[str, Any] = {}
    elif rpa.call_form == "flat":
        factory = ()
        args = tuple(get(p) for p in rpa.params)
        # Listed kwargs we have no value for (decode_query_size: batched kernel only) keep their defaults.
        kwargs = {p: get(p) for p in rpa.optional_kwargs if p in FILLABLE}
    else:
        raise KernelUnavailableError(
            "unknown RPA call form in the matrix",
            argument="rpa.call_form",
            expected="curried|flat",
            found=rpa.call_form,
            fix="set rpa.call_form of this tpu_inference row in compat_matrix.yaml to 'curried' or 'flat' "
            "(or upgrade maxtext-compat, if the matrix is from a newer release)",
        )
    order = rpa.returns.replace(" ", "")
    if order not in ("(output,kv_cache)", "(kv_cache,output)"):
        raise KernelUnavailableError(
            "unknown RPA return order in the matrix",
            argument="rpa.returns",
            expected="(output, kv_cache) or (kv_cache, output)",
            found=rpa.returns,
            fix="set rpa.returns of this tpu_inference row in compat_matrix.yaml to '(output, kv_cache)' or "
            "'(kv_cache, output)', as the release's kernel returns them",
        )
    return RpaCall(rpa.call_form, factory, args, kwargs, order == "(kv_cache,output)")


def call_rpa(fn: Callable[..., Any], call: RpaCall) -> tuple[Any, Any]:
    """Make the planned call; returns (output, kv_cache) whatever order the release returns."""
    result = fn(*call.factory_args)(*call.args) if call.form == "curried" else fn(*call.args, **call.kwargs)
    first, second = result
    return (second, first) if call.swap_returns else (first, second)


def _is_default(value: Any, default: Any) -> bool:
    if default is None:
        return value is None
    return value is default or (isinstance(value, bool) and value == default)


# --------------------------------------------------------------------------------------------
# The dispatcher
# --------------------------------------------------------------------------------------------


_JIT_LOCK = fork_safe_lock()
_JIT_CACHE: dict[tuple[Any, ...], Callable[..., Any]] = {}


def _compiled(fn: Callable[..., Any], row: TpuInferenceRow, mesh: Mesh, static: tuple[Any, ...]) -> Callable[..., Any]:
    """One jitted wrapper per (entry point, row, mesh, static options): compile once per shape."""
    import jax

    key = (fn, str(row.versions), mesh, static)
    with _JIT_LOCK:
        cached = _JIT_CACHE.get(key)
        if cached is not None:
            return cached
        sm_scale, sliding_window, soft_cap, update_kv_cache, use_causal_mask, label = static

        def run(q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, attention_sink):
            values = {
                "mesh": mesh, "q": q, "k": k, "v": v, "kv_cache": kv_cache, "kv_lens": kv_lens,
                "page_indices": page_indices, "cu_q_lens": cu_q_lens, "distribution": distribution,
                "attention_sink": attention_sink, "sm_scale": sm_scale, "attention_chunk_size": sliding_window,
                "update_kv_cache": update_kv_cache, "use_causal_mask": use_causal_mask,
                "attn_logits_soft_cap": soft_cap,
            }  # fmt: skip
            return call_rpa(fn, plan_call(row, values, label=label))

        compiled = jax.jit(run)
        _JIT_CACHE[key] = compiled
        return compiled


@checked
def ragged_paged_attention(
    q: Array,
    k: Array,
    v: Array,
    kv_cache: Array,
    metadata: Metadata,
    *,
    mesh: Mesh,
    sm_scale: Scale = 1.0,
    sliding_window: Window | None = None,
    soft_cap: SoftCap | None = None,
    attention_sink: Array | None = None,
    update_kv_cache: bool = True,
    use_causal_mask: bool = True,
    row: TpuInferenceRow | None = None,
) -> tuple[Any, Any]:
    """Ragged paged attention through the installed tpu-inference; returns (out, new_kv_cache).

    q [T, Nq, D], k/v [T, Nkv, D] (T = padded token rows, in the metadata's kernel order),
    kv_cache one layer's cache (see paged.KVCacheLayout), metadata a paged.RaggedMetadata or
    tpu-inference AttentionMetadata. The KV heads are sharded on the mesh's model axis; with
    fewer KV heads than that axis, tpu-inference repeats them (the cache must hold the repeats,
    which KVCacheLayout(tp=...) does). sm_scale multiplies q.k (MaxText passes 1.0 with the
    scale folded into q); sliding_window is tpu-inference's attention_chunk_size; out rows past
    the batch's tokens are undefined. `row` overrides the installed release's matrix row.
    """
    import jax

    from maxtext_compat.kernel import interpret, mesh_limits
    from maxtext_compat.paged.checks import check_kernel_inputs
    from maxtext_compat.paged.sharding import check_mesh, head_parallelism

    if row is None:
        found = installed_rpa()
        row, label = found.row, found.label
    else:
        label = row_label(row)
    from maxtext_compat.paged.metadata import RaggedMetadata, source_of

    kv_lens, page_indices, cu_q_lens, distribution = metadata_arrays(metadata)
    source = source_of(metadata)  # our RaggedMetadata, or the one an AttentionMetadata was converted from
    if source is not None:
        source.check_current("metadata")
    host = None
    if isinstance(metadata, RaggedMetadata):
        host = (metadata.kv_lens, metadata.page_indices, metadata.cu_q_lens, metadata.distribution)
    check_mesh(mesh)
    tp = head_parallelism(mesh)
    hd64_kernel = row.rpa.call_form == "flat"  # the hd64 kernel arrived with the flat entry point (0.12)
    layout = check_kernel_inputs(
        q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution,
        tp=tp, hd64_kernel=hd64_kernel, sliding_window=sliding_window, soft_cap=soft_cap,
        attention_sink=attention_sink, host_values=host,
    )  # fmt: skip
    if source is not None:
        source.check_cache(layout.num_pages, layout.page_size)
    _check_kernel_features(layout.kernel, attention_sink, update_kv_cache, use_causal_mask, label)
    static = (float(sm_scale), sliding_window, soft_cap, bool(update_kv_cache), bool(use_causal_mask), label)
    # Plan once outside the trace so an unsupported feature fails before anything is traced.
    features = {
        "sm_scale": static[0], "attention_chunk_size": sliding_window, "attn_logits_soft_cap": soft_cap,
        "update_kv_cache": static[3], "use_causal_mask": static[4], "attention_sink": attention_sink,
    }  # fmt: skip
    check_features(row, features, label=label)
    cpu = interpret.on_cpu(mesh.devices.flat)
    mesh_limits.check_mesh(tp, interpret=cpu, jax_version=jax.__version__, num_kv_heads=layout.num_kv_heads)
    mode = interpret.interpret_mode() if cpu else None
    if cpu and mode is None:
        raise KernelUnavailableError(
            "the RPA kernel needs the CPU shim on a CPU backend (Pallas TPU interpret mode + interpreter patch)",
            argument="mesh",
            expected="maxtext_compat.cpu.rpa.install() called before the first trace",
            found=f"CPU devices, shim not installed ({label})",
            fix="call maxtext_compat.cpu.rpa.install() at start-up (tests: in conftest.py)",
        )
    run = _compiled(entry_point(row), row, mesh, static)
    with mode() if mode is not None else contextlib.nullcontext():
        return run(q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, attention_sink)


def _check_kernel_features(kernel: str, attention_sink: Any, update_kv_cache: bool, causal: bool, label: str) -> None:
    """Kernel-level limits tpu-inference raises NotImplementedError for, as typed errors up front."""
    if kernel == "v3" and attention_sink is not None:
        raise KernelUnavailableError(
            f"{label}: attention sinks are only implemented by the head_dim-64 kernel",
            argument="attention_sink",
            expected="None on the v3 kernel (head_dim != 64, or any head_dim on tpu-inference 0.11: no hd64 kernel)",
            found="an array",
            fix="drop attention_sink, or use head_dim 64 on tpu-inference >= 0.12",
        )
    if kernel == "hd64" and not update_kv_cache:
        raise KernelUnavailableError(
            f"{label}: the head_dim-64 kernel always writes the KV cache",
            argument="update_kv_cache",
            expected="True for head_dim 64",
            found=False,
            fix="pass update_kv_cache=True with head_dim 64 (the hd64 kernel always writes the new K/V), "
            "or use a head_dim other than 64 for calls that must not write the cache",
        )
    if kernel == "hd64" and not causal:
        raise KernelUnavailableError(
            f"{label}: the head_dim-64 kernel is causal only",
            argument="use_causal_mask",
            expected="True for head_dim 64",
            found=False,
            fix="pass use_causal_mask=True with head_dim 64 (non-causal attention needs a head_dim other than 64)",
        )
