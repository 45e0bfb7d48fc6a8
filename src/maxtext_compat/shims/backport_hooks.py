"""Context-gated hooks on a pre-#2616 MaxText's own classes (profile `backport-hooks`), and the write path every
call site hands the call rule (`WRITE_PATH`: the checks, and the 0.1.0 backport with these hooks).

Installed once per process through the shims core (atomic, reversible, listed by doctor);
each hook calls the original unchanged unless a `KVSession` is active, so MaxText's own
training and old-convention calls are untouched. Inside a session:
- AttentionOp.__call__ runs ragged paged attention on the q/k/v it is given;
- Attention.__call__ runs in train mode, so MaxText's own KV-cache variables are skipped
  (0.2.x skips them the same way in vLLM mode);
- Decoder.set_remat_policy refuses scanned stacks and returns the layers without `nn.remat`
  (inference needs no rematerialisation, and remat would trap the updated caches in its trace);
- Decoder._apply_output_head records the pre-norm hidden state (the Transformer returns it).
"""

from __future__ import annotations

from typing import Any

from maxtext_compat import names
from maxtext_compat.backport.attention import attend
from maxtext_compat.backport.session import current
from maxtext_compat.backport.write_path import WritePath
from maxtext_compat.errors import BackportError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.patching import PatchSpec, profiles
from maxtext_compat.patching.registry import REGISTRY
from maxtext_compat.patching.shim import Shim

PROFILE = names.BACKPORT_HOOKS
FULL_PROFILE = names.VLLM_BACKPORT  # MaxText's full backport shim (maxtext_compat.shims) carries these hooks
TRAIN = names.TRAIN


def _attention_op_hook(original: Any) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        session = current()
        if session is None or not session.route:
            return wrapped(*args, **kwargs)
        query, key, value = args[:3]
        sinks = kwargs.get("sinks", args[8] if len(args) > 8 else None)
        return attend(session, instance, query, key, value, sinks)

    return wrapper


def _attention_hook(original: Any) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        session = current()
        if session is None or not session.route:
            return wrapped(*args, **kwargs)
        return wrapped(*args, **{**kwargs, "model_mode": TRAIN})

    return wrapper


def _remat_hook(original: Any) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        session = current()
        if session is None or not session.route:
            return wrapped(*args, **kwargs)
        if getattr(instance.config, "scan_layers", False):
            raise BackportError(
                "the backported vLLM path needs an unscanned decoder",
                argument="scan_layers",
                expected="False (MaxText's own configs/inference/vllm.yml sets it)",
                found=True,
                fix="build the model with scan_layers=False; convert scanned weights with "
                "maxtext_compat.serving.param_trees.unscan_params",
            )
        block_layers = args[0] if args else kwargs["block_layers"]
        return list(block_layers)

    return wrapper


def _output_head_hook(original: Any) -> Any:
    # Decoder.__call__ itself is reached through Linen's apply, which unwraps patched methods;
    # the output head is called as a plain method with the pre-norm hidden state.
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        session = current()
        if session is not None:
            session.hidden = args[1] if len(args) > 1 else kwargs.get("y", kwargs.get("hidden_state"))
        return wrapped(*args, **kwargs)

    return wrapper


def specs(row: MaxTextRow) -> list[Any]:
    def ref(key: str) -> str:
        cls = row.classes[key]
        if cls is None:
            raise BackportError(
                f"MaxText {row.name} has no {key} class to hook",
                argument=key,
                fix=f"set classes.{key} of the {row.name} row in compat_matrix.yaml to the release's class",
            )
        return str(cls)

    return [
        PatchSpec(f"{ref('attention_op')}.__call__", _attention_op_hook, origin=f"{__name__}._attention_op_hook"),
        PatchSpec(f"{ref('attention')}.__call__", _attention_hook, origin=f"{__name__}._attention_hook"),
        PatchSpec(f"{ref('decoder')}.set_remat_policy", _remat_hook, origin=f"{__name__}._remat_hook"),
        PatchSpec(f"{ref('decoder')}._apply_output_head", _output_head_hook, origin=f"{__name__}._output_head_hook"),
    ]


class BackportHooksShim(Shim):
    """The four hooks on the row's own classes, inert outside a backport KV session."""

    name = PROFILE
    description = "inert unless a backport KV session is active"
    verified_for = (names.MAXTEXT_RELEASES,)  # built for the rows without a vLLM path (0.1.0)

    def __init__(self, row: MaxTextRow) -> None:
        self.row = row

    def applies(self) -> str | None:
        if profiles.installed(FULL_PROFILE):
            return f"profile {FULL_PROFILE!r} is installed and includes these hooks"
        return None

    def specs(self) -> list[PatchSpec]:
        return specs(self.row)

    def facts(self) -> dict[str, str]:
        return {"maxtext": self.row.name}


def ensure_installed(row: MaxTextRow) -> None:
    """Install the hooks for `row` (idempotent, all or nothing). Asked by every backport call, so the answer for an
    installed shim is two dict lookups without the engine's lock (a dict read is atomic under the GIL; the
    install itself takes the lock and decides again)."""
    installed = REGISTRY.installed
    if PROFILE in installed or FULL_PROFILE in installed:  # the full shim includes these hooks
        return
    BackportHooksShim(row).install()


def _ensure_installed_now(row: MaxTextRow) -> None:
    ensure_installed(row)  # looked up per call: a test can stand in for ensure_installed


WRITE_PATH = WritePath(ensure_hooks=_ensure_installed_now)
