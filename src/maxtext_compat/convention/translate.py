"""Translate a caller's arguments into the keyword call the installed release accepts.

Why keywords: positional slots moved between releases (`out_sharding` became Attention's
fifth positional parameter in 0.2.0; #3372 reordered LlamaDecoderLayer's tail), so the
adapter binds the caller's arguments against the advertised signature and then calls the
native module only by keyword. Parameters the release lacks are dropped only when they
carry no value (None); anything else is translated or refused with a typed error that names
the argument, the release and the alternative.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from maxtext_compat.convention.binding import make_binder
from maxtext_compat.convention.kinds import KINDS
from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.matrix import MaxTextRow

SameMetadata = Callable[[Any, Any], bool]

# Why a parameter cannot be passed to a release that lacks it, and what to do instead.
REFUSALS: dict[str, str] = {
    "page_state": (
        "MaxText removed its own paged attention (PR #3948, 0.2.3); pass kv_cache= and attention_metadata= to use "
        "tpu-inference's ragged paged attention instead"
    ),
    "rope_kwargs": "this release's RoPE takes no per-call arguments; configure RoPE in the MaxText config instead",
    "shared_key": "cross-layer KV sharing (Gemma 4) needs MaxText 0.2.3 or newer",
    "shared_value": "cross-layer KV sharing (Gemma 4) needs MaxText 0.2.3 or newer",
    "model_mode": "this release fixes model_mode when the module is constructed; construct it with that model_mode",
    "multimodal_input": "multimodal inputs are passed as image_embeddings/bidirectional_mask in this release",
    "cache": "this release's Transformer takes no `cache` argument",
}


@dataclass(slots=True)
class Translated:
    """The native keyword call plus what the adapter must do around it."""

    kwargs: dict[str, Any]
    is_new: bool
    written: bool = False  # the caller named kv_cache/attention_metadata (kv_caches)
    kv: Any = None  # kv_cache (attention / layer) or kv_caches (decoder / transformer)
    metadata: Any = None
    out_sharding: Any = None  # applied by the adapter when the release has no such parameter
    dropped: tuple[str, ...] = ()  # parameters the release lacks, passed as None: left out


def bind(advertised: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any], where: str) -> dict:
    try:
        bound = advertised.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentTypeError(
            f"the call does not fit {where}: {exc}",
            argument="arguments",
            expected=f"{where}{advertised}",
            found=f"{len(args)} positional argument(s) and keywords {sorted(kwargs)}",
            fix="pass the arguments by keyword as in the signature above",
        ) from None
    arguments = dict(bound.arguments)
    var_kw = [p.name for p in advertised.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    for name in var_kw:
        arguments.update(arguments.pop(name, {}))
    return arguments


class Translator:
    """`translate` for one call site: what does not change between calls (the binder, the release's parameter
    names, the KV argument names) is computed once, when the adapter class or the shim wrapper is made."""

    def __init__(
        self,
        kind: str,
        row: MaxTextRow,
        native: inspect.Signature,
        advertised: inspect.Signature,
        where: str,
        *,
        same_metadata: SameMetadata,
    ) -> None:
        """same_metadata: whether two metadata objects hold equal arrays (the kernel side knows; see
        per_layer_metadata)."""
        self.kind, self.row, self.native, self.advertised, self.where = kind, row, native, advertised, where
        self.same_metadata = same_metadata
        self.kv_name, self.md_name = KINDS[kind].new_params
        self.native_names = frozenset(native.parameters)
        self.native_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in native.parameters.values())
        self.kv_in_native = self.kv_name in self.native_names
        self._bind = make_binder(advertised)

    def arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """What the caller passed, by parameter name (a call that does not fit is a typed error)."""
        if self._bind is not None:
            try:
                return self._bind(*args, **kwargs)
            except TypeError:
                pass  # inspect binds it again, for the message of the typed error
        return bind(self.advertised, args, kwargs, self.where)

    def __call__(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, force_new: bool = False) -> Translated:
        """Bind against the advertised signature and produce the native keyword call.

        force_new: the caller declared `kv_return`, so a call naming no KV argument is a new call too.
        """
        arguments = self.arguments(args, kwargs)
        kv_name, md_name = self.kv_name, self.md_name
        # What the caller wrote decides the convention, not the values: `kv_cache=None` is a new call
        # (code half-way through a migration passes None), and gets the new return.
        written = kv_name in arguments or md_name in arguments
        is_new = written or force_new
        kv = arguments.pop(kv_name, None)
        md = arguments.pop(md_name, None)
        if isinstance(md, Mapping):
            md = per_layer_metadata(self.kind, self.row, md, kv, self.where, same=self.same_metadata)
        if self.native_var_kw or arguments.keys() <= self.native_names:  # every argument is the release's own
            if is_new and self.kv_in_native:
                arguments[kv_name], arguments[md_name] = kv, md
            return Translated(arguments, is_new, written, kv, md)  # the bound arguments are the native call
        out = Translated({}, is_new, written, kv, md)
        if is_new and self.kv_in_native:
            out.kwargs[kv_name] = kv
            out.kwargs[md_name] = md
        for name, value in arguments.items():
            if name in self.native_names:
                out.kwargs[name] = value
            elif value is None:
                out.dropped += (name,)  # absent and unset: nothing to translate
            elif name == "out_sharding":
                out.out_sharding = value  # 0.1.0 has no out_sharding: the adapter constrains the output
            else:
                reason = REFUSALS.get(name, "this release has no such parameter")
                raise InvalidArgumentError(
                    f"MaxText {self.row.name} cannot take `{name}` in {self.where}: {reason}",
                    argument=name,
                    expected=f"None (MaxText {self.row.name} has no `{name}` parameter)",
                    found=describe(value),
                    fix=reason,
                )
        return out


def layer_entry(md: Mapping[Any, Any], layer: int) -> Any:
    """The key MaxText 0.2.5's NNXDecoder reads for a layer: "layer.{i}", else the index itself."""
    return md.get(f"layer.{layer}", md.get(layer))


def per_layer_metadata(
    kind: str, row: MaxTextRow, md: Mapping[Any, Any], kv: Any, where: str, *, same: SameMetadata
) -> Any:
    """tpu-inference's per-layer attention_metadata (a dict, several KV-cache groups): passed on where the
    release reads it per layer and every layer has its entry; one object where every layer has the same one
    (`same(a, b)`: equal arrays); else refused. Never a layer silently given another layer's, or no, metadata."""
    if not KINDS[kind].per_layer:
        raise InvalidArgumentError(
            f"{where} takes one layer's attention metadata, not the per-layer dict",
            argument="attention_metadata",
            expected="one AttentionMetadata (this layer's)",
            found=f"a dict with keys {sorted(map(str, md))[:4]}",
            fix='pass this layer\'s entry: attention_metadata["layer.<i>"]',
        )
    layers = len(kv) if isinstance(kv, (list, tuple)) else None
    if layers is None:
        raise InvalidArgumentError(
            f"{where} got a per-layer attention_metadata dict without kv_caches to say how many layers it covers",
            argument="attention_metadata",
            expected="a dict together with kv_caches=[one cache per layer]",
            found=f"a dict with {len(md)} entries and kv_caches={describe(kv)}",
            fix="pass kv_caches= with the per-layer dict, or one AttentionMetadata",
        )
    entries = [layer_entry(md, i) for i in range(layers)]
    missing = [i for i, e in enumerate(entries) if e is None]
    if missing:
        raise InvalidArgumentError(
            f"the per-layer attention_metadata has no entry for layer(s) {missing} of {layers}",
            argument="attention_metadata",
            expected=f'keys "layer.0" .. "layer.{layers - 1}" (or 0 .. {layers - 1})',
            found=f"keys {sorted(map(str, md))[:8]}",
            fix="give every layer its metadata (a layer without one would run without its KV cache)",
        )
    if row.vllm is not None and row.vllm.per_layer_metadata:
        return md  # the release reads it per layer (0.2.5's NNXDecoder)
    if all(e is entries[0] or same(e, entries[0]) for e in entries):
        return entries[0]  # one KV-cache group: every layer shares the one metadata (or equal copies of it)
    if not row.has_kv_params:
        return md  # several groups on the backport: its KV session hands each layer its own entry
    raise InvalidArgumentError(
        f"MaxText {row.name} gives every layer the same attention metadata; this dict holds several",
        argument="attention_metadata",
        expected="one AttentionMetadata for every layer (one KV-cache group)",
        found=f"{len({id(e) for e in entries})} different metadata objects over {layers} layers",
        fix="serve this model (several KV-cache groups) with MaxText 0.2.5 or newer",
    )


def describe(value: Any) -> str:
    """An argument's value for an error message: type and shape for arrays, a short repr otherwise."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
