"""Cached tiny models of the installed MaxText with their mesh, context and calls (the plugin's `tiny_maxtext_*`).

Why a bundle and a cache: a model alone is not callable in a test (each release wants its own
mesh and logical-axis-rules context, and the paged path a vLLM config on 0.2.x but the backport on
0.1.0), and building one costs seconds on CPU. `TinyMaxText` builds each spec once per session;
`TinyModel` carries what a call needs and makes the old and the paged new call in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.testing import tiny

if TYPE_CHECKING:
    from maxtext_compat.testing.paged_steps import PagedStep

SPEC_HELP = "a family name ('default', 'qwen3', 'gemma3'), or a dict {family, paged, tp, scan_layers, **config}"


@dataclass(frozen=True)
class TinySpec:
    """What to build: family, paged (ready for the kv_cache/attention_metadata call), tp, scan_layers, overrides."""

    family: str = "default"
    paged: bool = False
    tp: int = 1
    scan_layers: bool = False
    overrides: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, param: Any = None, **kw: Any) -> TinySpec:
        """From a fixture param: None, a family name, a mapping, or a TinySpec; `kw` wins."""
        if param is None:
            given: dict[str, Any] = {}
        elif isinstance(param, TinySpec):
            given = {f.name: getattr(param, f.name) for f in fields(param)}
            given.update(dict(given.pop("overrides")))
        elif isinstance(param, str):
            given = {"family": param}
        elif isinstance(param, Mapping):
            given = dict(param)
        else:
            raise InvalidArgumentTypeError(
                "cannot read a tiny model spec from this parameter",
                argument="tiny_maxtext_model",
                expected=SPEC_HELP,
                found=repr(param),
                fix="parametrize tiny_maxtext_model with a family name such as 'qwen3' or a dict such as "
                "{'family': 'qwen3', 'tp': 2}",
            )
        given.update(kw)
        known = {f.name for f in fields(cls)} - {"overrides"}
        spec = cls(
            **{k: v for k, v in given.items() if k in known},
            overrides=tuple(sorted((k, v) for k, v in given.items() if k not in known)),
        )
        if spec.family not in tiny.FAMILIES:
            raise InvalidArgumentError(
                "unknown tiny model family",
                argument="family",
                expected=f"one of {sorted(tiny.FAMILIES)}",
                found=repr(spec.family),
                fix=f"use family= one of {sorted(tiny.FAMILIES)}",
            )
        return spec

    def key(self) -> tuple[Any, ...] | None:
        """A cache key, or None when an override value is unhashable (then nothing is cached)."""
        try:
            hash(self)
        except TypeError:
            return None
        return (self.family, self.paged, self.tp, self.scan_layers, self.overrides)

    def label(self) -> str:
        extra = [k for k, v in (("paged", self.paged), ("scan_layers", self.scan_layers)) if v]
        extra += [f"tp={self.tp}"] if self.tp != 1 else []
        extra += [f"{k}={v!r}" for k, v in self.overrides]
        return self.family + (f" ({', '.join(extra)})" if extra else "")


def _native_paged(row: MaxTextRow, spec: TinySpec) -> bool:
    """A paged spec on a release with MaxText's own vLLM path (0.2.x): vllm.yml config, autoregressive model."""
    return spec.paged and row.has_kv_params


def _old_step(m: Any, tokens: Any, positions: Any) -> Any:
    return m(tokens, positions, enable_dropout=False, model_mode="train")


def _paged_step(m: Any, tokens: Any, positions: Any, kv_caches: Any, metadata: Any) -> Any:
    return m(tokens, positions, kv_caches=kv_caches, attention_metadata=metadata, model_mode="autoregressive")


@dataclass
class TinyModel:
    """MaxText's own Transformer with random weights, its config and mesh, and the calls tests make."""

    row: MaxTextRow
    spec: TinySpec
    config: Any
    mesh: Any
    transformer: Any  # the native module; `wrapped` takes both conventions

    def context(self) -> Any:
        """The mesh + logical-axis-rules context this release wants around every call."""
        return tiny.mesh_context(self.config, self.mesh, row=self.row)

    @cached_property
    def wrapped(self) -> Any:
        """The transformer through maxtext_compat.adapters.wrap (old and new call on every release)."""
        from maxtext_compat.adapters import wrap

        return wrap(self.transformer, row=self.row)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_decoder_layers)

    @property
    def num_kv_heads(self) -> int:
        return int(self.config.num_kv_heads)

    @property
    def head_dim(self) -> int:
        return int(self.config.head_dim)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    def inputs(self, *, batch: int = 2, seq: int = 16, seed: int = 1) -> dict[str, Any]:
        """Random x / tokens / positions / segment_ids of matching shapes."""
        return tiny.tiny_inputs(self.config, batch=batch, seq=seq, seed=seed)

    def attention(self, *, batch: int = 2, seq: int = 16, model_mode: str | None = None, seed: int = 0) -> Any:
        """A fresh MaxText Attention layer built from this model's config."""
        return tiny.tiny_attention(
            self.config, self.mesh, batch=batch, seq=seq, model_mode=model_mode, seed=seed, row=self.row
        )

    @cached_property
    def _jitted(self) -> dict[str, Any]:
        from flax import nnx

        return {"old": nnx.jit(_old_step), "paged": nnx.jit(_paged_step)}

    def old_call(self, tokens: Any, positions: Any = None) -> Any:
        """The pre-#2616 call (train mode) through the adapter: logits [batch, seq, vocab]."""
        import jax.numpy as jnp

        tokens = jnp.asarray(tokens, jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)
        with self.context():
            return self._jitted["old"](self.wrapped, tokens, positions)

    def paged_call(self, tokens: Any, step: PagedStep, caches: list[Any] | None = None) -> tuple[Any, list[Any]]:
        """The new call a serving engine makes: (hidden, kv_caches) for `step` (one token per row).

        tokens: [max_num_tokens, 1] in kernel order (`step.tokens(ids)` makes them). caches None uses
        the step's paged_kv_cache and stores the returned caches back into it.
        """
        if self.row.has_kv_params and not self.spec.paged:
            raise InvalidArgumentError(
                f"MaxText {self.row.name} writes the paged cache only from a vLLM config",
                argument="tiny_maxtext_model",
                expected="a model built with paged=True",
                found=self.spec.label(),
                fix='parametrize it indirectly with {"family": ..., "paged": True}',
            )
        given = step.caches if caches is None else caches
        with self.context():
            hidden, new = self._jitted["paged"](
                self.wrapped, tokens, step.positions, list(given), step.attention_metadata
            )
        if caches is None:
            step.cache.caches = new
        return hidden, list(new)

    def __repr__(self) -> str:
        return f"TinyModel(MaxText {self.row.name}, {self.spec.label()}, {self.num_layers} layers)"


class TinyMaxText:
    """Builds tiny configs and models of one MaxText row, each spec once (a session cache)."""

    def __init__(self, row: MaxTextRow) -> None:
        self.row = row
        self._configs: dict[tuple[Any, ...], Any] = {}
        self._models: dict[tuple[Any, ...], TinyModel] = {}

    def spec(self, param: Any = None, **kw: Any) -> TinySpec:
        spec = TinySpec.parse(param, **kw)
        if _native_paged(self.row, spec) and spec.tp != 1:
            raise InvalidArgumentError(
                "the paged tiny model runs on one device (vllm.yml meshes have no tensor-parallel knob)",
                argument="tp",
                expected=1,
                found=spec.tp,
                fix="use tp=1 with paged=True, or paged=False for a tensor-parallel model",
            )
        return spec

    def config(self, param: Any = None, **kw: Any) -> Any:
        """MaxText config of a tiny model (cached per spec)."""
        spec = self.spec(param, **kw)
        key = spec.key()
        if key is not None and key in self._configs:
            return self._configs[key]
        cfg = tiny.tiny_config(
            spec.family,
            tp=spec.tp,
            scan_layers=spec.scan_layers,
            vllm=_native_paged(self.row, spec),
            row=self.row,
            **dict(spec.overrides),
        )
        if key is not None:
            self._configs[key] = cfg
        return cfg

    def mesh(self, config: Any, spec: TinySpec) -> Any:
        if _native_paged(self.row, spec):  # vllm.yml meshes: one device, every axis 1
            import jax
            import numpy as np
            from jax.sharding import Mesh

            devices = np.array(jax.devices()[:1]).reshape([1] * len(config.mesh_axes))
            return Mesh(devices, config.mesh_axes)
        return tiny.tiny_mesh(config, spec.tp, row=self.row)

    def model(self, param: Any = None, *, fresh: bool = False, **kw: Any) -> TinyModel:
        """A tiny model (shared per spec for the session unless fresh=True: treat shared ones as read-only)."""
        spec = self.spec(param, **kw)
        key = spec.key()
        if not fresh and key is not None and key in self._models:
            return self._models[key]
        cfg = self.config(spec)
        mesh = self.mesh(cfg, spec)
        mode = tiny.api(self.row).modes[2] if _native_paged(self.row, spec) else None
        module = tiny.tiny_transformer(cfg, mesh, model_mode=mode, row=self.row)
        model = TinyModel(self.row, spec, cfg, mesh, module)
        if not fresh and key is not None:
            self._models[key] = model
        return model
