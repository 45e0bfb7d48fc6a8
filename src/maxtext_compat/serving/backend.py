"""The seam between the version-agnostic vLLM model and one family of MaxText releases.

Why a backend: `MaxTextForCausalLM` (model.py) speaks tpu-inference's JAX model interface, which
does not depend on the MaxText release; how to load a config, build the model with weights,
run one serving step and turn hidden states into logits does. MaxText 0.2.x has a native vLLM
path (`native.NativeBackend`); 0.1.0 has none and gets one from the backport, whose backend the
lead adds as `maxtext_compat.serving.backport_backend:BackportBackend` (or registers with
`register_backend`). Selection is by the resolved matrix row, never by trying calls.

Everything here is light: backends import MaxText/jax only inside their methods.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maxtext_compat.errors import BackendUnavailableError, InvalidArgumentError
from maxtext_compat.locks import fork_safe_lock

if TYPE_CHECKING:
    from maxtext_compat.matrix import MaxTextRow


@dataclass(frozen=True)
class StepOutput:
    """One serving step: hidden states (T, D) before the final norm and the layer-ordered KV caches."""

    hidden: Any
    kv_caches: list[Any]
    expert_indices: Any = None


class ServingBackend(abc.ABC):
    """How one family of MaxText releases is served. One instance per process, shared by models.

    Contract (shapes are per serving step; T = padded number of scheduled tokens):
    - `prepare()` runs once per process from the vLLM plugin, before any model is built: apply
      the shim profile this release needs (idempotent; vLLM loads plugins in every process).
    - `load_config(overrides)` -> the release's pyconfig object, from its vLLM base config
      (attention must be the release's vLLM path) plus `overrides` (maxtext_config after
      KV-head padding). Must keep the caller's XLA_FLAGS.
    - `create_model(cfg, mesh, rng_key)` -> the MaxText model with weights sharded on `mesh`:
      restored from `cfg.load_parameters_path` when set (KV heads repeated up to the padded
      count), random from `rng_key` otherwise. Called under `with mesh:`.
    - `forward(...)` -> `StepOutput`. input_ids (T,) int32, positions (T,) int32,
      `kv_caches` is one cache per decoder layer in layer order (RPA v3 layout, donated),
      `attention_metadata` is tpu-inference's `AttentionMetadata` (or a dict of them).
    - `compute_logits(model, cfg, mesh, hidden)` -> (T, vocab): final norm + output head.
    - `embed(model, cfg, mesh, input_ids)` -> (T, D); `embedding_table(...)` -> (vocab, D).
    - `num_layers(cfg)` -> number of decoder layers (= KV caches); `check_mesh(cfg, mesh)`
      (optional) -> typed error when the runner's mesh cannot host the config.
    Test/tool helpers (not on the serving path, used by checkpoint.py, reference.py and convert):
    - `base_config(overrides)` -> the release's base.yml config plus `overrides`;
    - `save_checkpoint(cfg, path, seed, mesh=None, params=None)` -> the `load_parameters_path` to
      pass to serving: random weights of `cfg`'s model, or `params` ({path: array}, checked against
      the model's own paths and shapes) when given; mesh None: the config's own mesh;
    - `dense_logits_fn(cfg, mesh)` -> f(tokens (B, S) int32) -> logits (B, S, vocab) from
      MaxText's own non-vLLM path (train mode, dot-product attention) over the weights of
      `cfg.load_parameters_path` (the checkpoint the server loads).
    """

    name: str = "abstract"

    def __init__(self, row: MaxTextRow) -> None:
        self.row = row

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Apply the shims this release needs for serving in this process (idempotent)."""

    @abc.abstractmethod
    def load_config(self, overrides: dict[str, Any]) -> Any: ...

    @abc.abstractmethod
    def create_model(self, cfg: Any, mesh: Any, rng_key: Any) -> Any: ...

    @abc.abstractmethod
    def forward(
        self,
        model: Any,
        cfg: Any,
        mesh: Any,
        *,
        input_ids: Any,
        positions: Any,
        kv_caches: list[Any],
        attention_metadata: Any,
        inputs_embeds: Any = None,
    ) -> StepOutput: ...

    @abc.abstractmethod
    def compute_logits(self, model: Any, cfg: Any, mesh: Any, hidden: Any) -> Any: ...

    @abc.abstractmethod
    def embed(self, model: Any, cfg: Any, mesh: Any, input_ids: Any) -> Any: ...

    @abc.abstractmethod
    def embedding_table(self, model: Any, cfg: Any, mesh: Any) -> Any: ...

    def num_layers(self, cfg: Any) -> int:
        return int(cfg.num_decoder_layers)

    def check_mesh(self, cfg: Any, mesh: Any) -> None:  # noqa: B027 - optional hook
        """Raise a typed error when tpu-inference's mesh cannot host this config (before any weights)."""

    @abc.abstractmethod
    def save_checkpoint(
        self, cfg: Any, path: str, seed: int = 0, mesh: Any = None, params: Mapping[str, Any] | None = None
    ) -> str: ...

    def base_config(self, overrides: dict[str, Any]) -> Any:
        """The release's base (training/decode) config plus `overrides`, for writing checkpoints."""
        raise BackendUnavailableError(
            f"the {self.name!r} backend cannot build a base config",
            argument="backend",
            expected="a backend that implements base_config (the built-in ones do)",
            found=type(self).__name__,
            fix="implement base_config(overrides) in the registered backend",
        )

    @abc.abstractmethod
    def dense_logits_fn(self, cfg: Any, mesh: Any) -> Callable[[Any], Any]: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} for MaxText {self.row.name}>"


BackendFactory = Callable[["MaxTextRow"], ServingBackend]
Predicate = Callable[["MaxTextRow"], bool]


@dataclass(frozen=True)
class _Entry:
    name: str
    applies: Predicate
    factory: BackendFactory | str  # a callable, or "module:attr" imported on first use
    description: str


def _native_applies(row: MaxTextRow) -> bool:
    return row.vllm is not None


def _backport_applies(row: MaxTextRow) -> bool:
    return row.vllm is None


# Later entries win: a user registration overrides a built-in one for the same rows.
_ENTRIES: list[_Entry] = [
    _Entry(
        "native",
        _native_applies,
        "maxtext_compat.serving.native:NativeBackend",
        "MaxText's own vLLM path (attention=vllm_rpa), releases whose matrix row has a `vllm` entry",
    ),
    _Entry(
        "backport",
        _backport_applies,
        "maxtext_compat.serving.backport_backend:BackportBackend",
        "releases without a vLLM path (0.1.0), through maxtext_compat's backport",
    ),
]
_LOCK = fork_safe_lock()
_INSTANCES: dict[tuple[str, str], ServingBackend] = {}


def register_backend(name: str, factory: BackendFactory | str, *, applies: Predicate, description: str = "") -> None:
    """Register (or replace) a backend; it wins over earlier entries for the rows it applies to."""
    if not name or not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise InvalidArgumentError(
            "register_backend needs a name and a factory",
            argument="register_backend",
            expected="a name and a callable(row) -> ServingBackend, or 'module:Class'",
            found=f"name={name!r}, factory={factory!r}",
            fix="call register_backend('my-backend', MyBackend, applies=...) with a non-empty name and a factory "
            "that is callable or a 'package.module:Class' string",
        )
    with _LOCK:
        _ENTRIES[:] = [e for e in _ENTRIES if e.name != name]
        _ENTRIES.append(_Entry(name, applies, factory, description))
        for key in [k for k in _INSTANCES if k[0] == name]:
            del _INSTANCES[key]


def registered_backends() -> dict[str, str]:
    with _LOCK:
        return {e.name: e.description for e in _ENTRIES}


def entry_for(row: MaxTextRow) -> _Entry:
    with _LOCK:
        for entry in reversed(_ENTRIES):
            if entry.applies(row):
                return entry
    raise BackendUnavailableError(
        f"no serving backend applies to MaxText {row.name}",
        argument="maxtext",
        expected=f"a release one of {[e.name for e in _ENTRIES]} applies to",
        found=row.name,
        fix="register one with maxtext_compat.serving.register_backend()",
    )


def _load_factory(entry: _Entry, row: MaxTextRow) -> BackendFactory:
    if callable(entry.factory):
        return entry.factory
    module, _, attr = entry.factory.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailableError(
            f"the {entry.name!r} serving backend for MaxText {row.name} is not available",
            argument="maxtext",
            expected=f"{entry.factory} importable ({entry.description})",
            found=f"{type(exc).__name__}: {exc}",
            fix="install a maxtext-compat that ships it, or register one with register_backend()",
        ) from exc


def backend_for(row: MaxTextRow) -> ServingBackend:
    """The (per-process, cached) backend instance for `row`."""
    entry = entry_for(row)
    key = (entry.name, row.name)
    with _LOCK:
        inst = _INSTANCES.get(key)
        if inst is None:
            inst = _load_factory(entry, row)(row)
            if not isinstance(inst, ServingBackend):
                raise BackendUnavailableError(
                    f"the {entry.name!r} backend factory returned {type(inst).__name__}",
                    argument=entry.name,
                    expected="a ServingBackend instance",
                    found=type(inst).__name__,
                    fix="make the factory return a ServingBackend subclass instance",
                )
            _INSTANCES[key] = inst
        return inst


def reset_backends(names: Sequence[str] = ()) -> None:
    """Forget cached instances (all, or of `names`); tests use it."""
    with _LOCK:
        for key in [k for k in _INSTANCES if not names or k[0] in names]:
            del _INSTANCES[key]
