"""A writing new call's path below the call rule: its checks, then the release's vLLM path or the backport.

Why a module of its own, above the kernel: the call rule (`maxtext_compat.convention`) decides what a call
means and sits below the paged KV cache and the kernel; what a call that writes the cache must hand over is
kernel knowledge (layouts, metadata arrays, where each write lands), and the 0.1.0 backport runs the kernel.
Whoever builds a `CallSite` (the adapters, the shim profiles) hands the rule a `WritePath`, so the rule reaches
this module without importing it; the one they hand it (`shims.backport_hooks.WRITE_PATH`) carries how the 0.1.0
backport's hooks are installed, which are shims and sit above this module.

Why the checks run before either path: on MaxText 0.2.x the adapter hands the caches and the metadata to
MaxText's vLLM path and on 0.1.0 to the backport, and each failed in its own way. Found: a Transformer call
with one cache fewer than its decoder layers was a raw IndexError on 0.2.5 (typed on 0.1.0), one more was
accepted and handed back unwritten on 0.2.5 (typed on 0.1.0), a cache of another dtype ran on 0.1.0 (the
backport casts) and was a raw ValueError inside tpu-inference on 0.2.5, our own RaggedMetadata worked on
0.1.0 and was an AttributeError on 0.2.5. Every check below runs before either path, so the same input gets
the same answer: the same typed error, or a call that both paths can run (our RaggedMetadata is handed to
MaxText 0.2.x as tpu-inference's AttentionMetadata, which it reads).

A cache that is not an array, a Python list where one cache belongs, or a cache list of the wrong length is
refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from maxtext_compat.backport import call as backport
from maxtext_compat.convention.kinds import METADATA, Kind
from maxtext_compat.convention.translate import Translated, describe, layer_entry
from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError, KernelUnavailableError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.paged.checks import is_concrete
from maxtext_compat.paged.guard import check_writes_described
from maxtext_compat.paged.layout import dtype_name, layout_for
from maxtext_compat.paged.metadata import RaggedMetadata, is_metadata, metadata_arrays
from maxtext_compat.paged.sharding import maxtext_head_parallelism
from maxtext_compat.resolution.installed_kernel import installed_rpa

ALLOCATE = "allocate them from one KVCacheLayout: maxtext_compat.paged.KVCacheLayout(...).allocate(num_layers)"


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def check_caches(kind: Kind, module: Any, t: Translated, where: str) -> list[Any]:
    """The caches of a writing call, as a list: one per decoder layer for the Decoder and the Transformer."""
    kv, name = t.kv, kind.kv_name
    if not kind.per_layer:
        if isinstance(kv, (list, tuple)):
            raise InvalidArgumentTypeError(
                f"{where} takes one layer's KV cache, not a list",
                argument=name,
                expected="one array [pages, page_size, combined heads, packing, lanes]",
                found=f"a {type(kv).__name__} of {len(kv)}",
                fix=f"pass this layer's cache: {name}=caches[layer_index]",
            )
        return [_array(kv, name, where)]
    if not isinstance(kv, (list, tuple)):
        raise InvalidArgumentTypeError(
            f"{where} takes one KV cache per decoder layer, as a list",
            argument=name,
            expected="a list of arrays, one per decoder layer",
            found=describe(kv),
            fix=f"pass {name}=[cache_of_layer_0, cache_of_layer_1, ...]; {ALLOCATE}",
        )
    layers = getattr(getattr(module, "config", None), "num_decoder_layers", None)
    if isinstance(layers, int) and len(kv) != layers:
        raise InvalidArgumentError(
            f"{where} got {len(kv)} KV cache(s) for {layers} decoder layers",
            argument=name,
            expected=f"{layers} caches (config.num_decoder_layers: one per decoder layer)",
            found=f"{len(kv)} caches",
            fix=f"pass exactly one KV cache per decoder layer; {ALLOCATE}",
        )
    return [_array(c, f"{name}[{i}]", where) for i, c in enumerate(kv)]


def _array(cache: Any, argument: str, where: str) -> Any:
    """`cache` when it is an array (a shape and a dtype): what a paged write is written into."""
    if not _is_array(cache):
        raise InvalidArgumentTypeError(
            f"{where}: a KV cache to write must be an array",
            argument=argument,
            expected="an array [pages, page_size, combined heads, packing, lanes]",
            found=describe(cache),
            fix=ALLOCATE,
        )
    return cache


def check_layouts(module: Any, arrays: list[tuple[int, Any]], name: str, where: str, per_layer: bool) -> None:
    """Every array cache (index, cache) has the layout and dtype the layer writes (the kernel casts nothing)."""
    cfg = getattr(module, "config", None)
    heads, head_dim, dtype = (getattr(cfg, a, None) for a in ("num_kv_heads", "head_dim", "dtype"))
    if not isinstance(heads, int) or not isinstance(head_dim, int):
        return
    try:
        hd64_kernel = installed_rpa().row.rpa.call_form == "flat"  # the hd64 kernel came with the flat entry point
    except KernelUnavailableError:
        return  # no kernel: the release's path refuses the call itself
    tp = maxtext_head_parallelism(getattr(module, "mesh", None))
    for i, cache in arrays:
        argument = f"{name}[{i}]" if per_layer else name
        if len(cache.shape) != 5:
            raise InvalidArgumentError(
                f"{where}: the KV cache must be 5-D [pages, page_size, combined heads, packing, lanes]",
                argument=argument,
                expected="a 5-D array",
                found=describe(cache),
                fix=ALLOCATE,
            )
        want = dtype_name(dtype) if dtype is not None else dtype_name(cache.dtype)
        layout = layout_for(kv_cache_shape=tuple(cache.shape), kv_cache_dtype=want, num_kv_heads=heads,
                            head_dim=head_dim, tp=tp, hd64_kernel=hd64_kernel)  # fmt: skip
        layout.check_cache(cache, argument=argument)


def check_metadata_form(metadata: Any, where: str) -> None:
    """With array caches, the metadata is ours or tpu-inference's with its four arrays (not Python lists)."""
    if isinstance(metadata, Mapping):
        return  # the per-layer dict: each entry is checked by check_writes_described
    if not is_metadata(metadata):
        raise InvalidArgumentTypeError(
            f"{where}: attention_metadata must carry the kernel's four arrays",
            argument="attention_metadata",
            expected="a maxtext_compat.paged.RaggedMetadata, or tpu-inference's AttentionMetadata with seq_lens, "
            "block_tables, query_start_loc and request_distribution as int32 arrays",
            found=describe(metadata),
            fix="build it with maxtext_compat.paged.build_metadata(...) (.to_attention_metadata() gives "
            "tpu-inference's); Python lists are not arrays: jnp.asarray(x, jnp.int32)",
        )


def for_release(t: Translated, md_name: str) -> None:
    """Our RaggedMetadata as what a release's own vLLM path reads (tpu-inference's AttentionMetadata); called on
    releases with the KV parameters (the backport reads ours itself)."""
    md = t.kwargs.get(md_name)
    if md is None:
        return
    if isinstance(md, RaggedMetadata):
        t.kwargs[md_name] = md.to_attention_metadata()
    elif isinstance(md, Mapping) and any(isinstance(v, RaggedMetadata) for v in md.values()):
        t.kwargs[md_name] = {
            k: v.to_attention_metadata() if isinstance(v, RaggedMetadata) else v for k, v in md.items()
        }


def check_new_call(kind: Kind, module: Any, row: MaxTextRow, t: Translated, where: str) -> None:
    """All of the above, in one order for every release (see the module docstring)."""
    caches = check_caches(kind, module, t, where)
    if not row.has_kv_params:
        installed_rpa()  # the backport runs the kernel itself: no tpu-inference is the first thing to say
    check_layouts(module, list(enumerate(caches)), kind.kv_name, where, kind.per_layer)
    check_metadata_form(t.metadata, where)


def check_kv_writes(kind: Kind, t: Translated, where: str) -> None:
    """Every KV write of a new call lands where its metadata says, or the call is refused (paged.guard)."""
    caches = kind.caches(t.kv)
    positions = t.kwargs.get("inputs_positions", t.kwargs.get("decoder_positions"))
    if isinstance(t.metadata, Mapping):  # per-layer metadata (checked complete by translate.per_layer_metadata)
        for layer, cache in enumerate(caches):
            check_writes_described([cache], layer_entry(t.metadata, layer), positions, f"{where} (layer {layer})")
        return
    check_writes_described(caches, t.metadata, positions, where)


def same_metadata(a: Any, b: Any) -> bool:
    """Two metadata objects with equal arrays (concrete ones: under jit only the same object is the same)."""
    if not (is_metadata(a) and is_metadata(b)):
        return False
    pairs = list(zip(metadata_arrays(a), metadata_arrays(b), strict=True))
    if not all(is_concrete(x) and is_concrete(y) for x, y in pairs):
        return False
    import numpy as np

    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in pairs)


class WritePath:
    """The `convention.rule.WritePath` a call site hands the rule: the checks and the two paths, holding only how
    the backport's hooks get installed (`ensure_hooks(row)`, from the shims layer above)."""

    __slots__ = ("ensure_hooks",)

    def __init__(self, *, ensure_hooks: Callable[[MaxTextRow], None]) -> None:
        if not callable(ensure_hooks):
            raise InvalidArgumentTypeError(
                "a write path needs a callable that installs the backport's hooks",
                argument="ensure_hooks",
                expected="a callable taking the matrix row (maxtext_compat.shims.backport_hooks.ensure_installed)",
                found=f"{type(ensure_hooks).__name__} {ensure_hooks!r}"[:200],
                fix="pass the function itself, e.g. WritePath(ensure_hooks=backport_hooks.ensure_installed)",
            )
        self.ensure_hooks = ensure_hooks

    def prepare(self, kind: Kind, module: Any, row: MaxTextRow, t: Translated, where: str) -> None:
        """The checks of a writing call, then its metadata as the release's own vLLM path reads it."""
        check_new_call(kind, module, row, t, where)
        check_kv_writes(kind, t, where)  # where the array caches are written
        if row.has_kv_params:
            for_release(t, METADATA)

    def legacy_call(
        self, module: Any, native_call: Callable[..., Any], kind: str, row: MaxTextRow, t: Translated,
        writes: bool, where: str,
    ) -> Any:  # fmt: skip
        """A new call on a release without the KV parameters (0.1.0): the backport (looked up per call, so a
        test can stand in for it)."""
        return backport.backport_call(module, native_call, kind, row, t, writes, where, self.ensure_hooks)

    def same_metadata(self, a: Any, b: Any) -> bool:
        return same_metadata(a, b)
