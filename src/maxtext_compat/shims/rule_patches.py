"""The call rule in MaxText's own classes: the patch specs of `call-rule` (releases with the KV parameters) and of
`vllm-backport` (0.1.0: the rule, its KV session and ragged paged attention), built from a matrix row.

Why apart from the shims' choice and registration (`maxtext_profiles`): what a profile patches is one job, which
profile a process gets is another; each is read without the other.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat import names
from maxtext_compat.backport.call import inner_call
from maxtext_compat.backport.session import current
from maxtext_compat.convention import callers
from maxtext_compat.convention.kinds import CLASS_KINDS
from maxtext_compat.convention.rule import CallSite, call_rule
from maxtext_compat.convention.signature import advertised_signature, native_signature
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.shims.backport_hooks import WRITE_PATH

BACKPORT = names.VLLM_BACKPORT
CALL_RULE = names.CALL_RULE


def unbound(wrapped: Any, instance: Any, args: tuple) -> tuple[Any, Any, tuple]:
    """wrapt passes instance=None when a method is called through the class (Linen's apply does)."""
    if instance is None and args:
        module = args[0]
        return (lambda *a, **k: wrapped(module, *a, **k)), module, args[1:]
    return wrapped, instance, args


# ----------------------------------------------------------------------------------------------
# vllm-backport: the call rule in MaxText's own classes
# ----------------------------------------------------------------------------------------------


def _rule_factory(kind: str, row: MaxTextRow) -> Any:
    def factory(original: Any) -> Any:
        native = native_signature(original.function)
        where = f"{getattr(original.owner, '__qualname__', original.owner)}.__call__"
        site = CallSite(kind, row, native, advertised_signature(native, kind), where, deprecation=False,
                        write_path=WRITE_PATH)  # fmt: skip
        native_call_var = callers.NATIVE_CALL
        routes = not row.has_kv_params  # only the backport opens KV sessions (0.1.0): decided once, here

        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            if instance is None and args:  # called through the class (Linen's apply does)
                call, module, args = unbound(wrapped, instance, args)
            else:
                call, module = wrapped, instance
            running = native_call_var.get()
            # NATIVE_CALL holds (id of the module running natively, ...): this module's own native call
            if running is not None and running[0] == id(module):
                return call(*args, **kwargs)  # the rule is applied to this very call already (an adapter's)
            if routes:
                session = current()
                if session is not None and session.route:
                    return inner_call(kind, row, call, args, kwargs, where)

            def native_call(m: Any, kw: dict[str, Any]) -> Any:
                token = native_call_var.set((id(m), True))  # what MaxText's code calls now is MaxText's own call
                try:
                    return call(**kw)
                finally:
                    native_call_var.reset(token)

            return call_rule(site, module, native_call, args, kwargs)

        return wrapper

    return factory


def _advertise(kind: str) -> Any:
    def source(fn: Any) -> Any:
        import inspect

        sig = advertised_signature(native_signature(fn), kind)
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return sig.replace(parameters=[self_param, *sig.parameters.values()])

    return source


BATCHED = "vllm_batched_rpa"


def _accept_vllm_rpa(row: MaxTextRow) -> Any:
    """pyconfig.validate_attention_kernel: also accept "vllm_rpa" (MaxText 0.2.x accepts it).

    "vllm_batched_rpa" (0.2.4+) is refused with a typed error: the backport runs one RPA call per
    layer (tpu-inference's batched kernel is bound at its import, not per config), so accepting the
    name would silently serve with the other kernel.
    """

    def factory(original: Any) -> Any:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            kernel = args[0] if args else kwargs.get("s")
            if kernel == "vllm_rpa":
                return None
            if kernel == BATCHED:
                from maxtext_compat.errors import ShimRefusedError

                raise ShimRefusedError(
                    f"attention={BATCHED!r} is not available on MaxText {row.name} with the vllm-backport shim",
                    argument="attention",
                    expected="'vllm_rpa' (the backported vLLM path)",
                    found=repr(kernel),
                    fix="set attention='vllm_rpa'; the batched kernel needs MaxText 0.2.4 or newer",
                )
            return wrapped(*args, **kwargs)

        return wrapper

    return factory


def _vllm_rpa_op_is_dot_product(original: Any) -> Any:
    """AttentionOp.__init__: under "vllm_rpa" the op itself is MaxText's dot-product op, as in 0.2.x
    (`attention_kernel == "vllm_rpa"` joins the dot-product dispatch; RPA runs in Attention)."""

    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("attention_kernel") == "vllm_rpa":
            kwargs = {**kwargs, "attention_kernel": "dot_product"}
        return wrapped(*args, **kwargs)

    return wrapper


def rule_specs(row: MaxTextRow) -> list[Any]:
    """The adapters' call rule in MaxText's own Attention, decoder layers, Decoder and Transformer classes."""
    from maxtext_compat.shims import PatchSpec

    specs = []
    here = __name__
    for key, kind in CLASS_KINDS:
        class_ref = row.classes.get(key)
        if class_ref is not None:
            ref = str(class_ref)
            specs.append(
                PatchSpec(
                    f"{ref}.__call__",
                    _rule_factory(kind, row),
                    signature=_advertise(kind),
                    origin=f"{here}._rule_factory({kind!r})",
                )
            )
    for ref in dict.fromkeys(str(r) for r in row.decoder_layers.values()):
        specs.append(
            PatchSpec(
                f"{ref}.__call__",
                _rule_factory("decoder_layer", row),
                signature=_advertise("decoder_layer"),
                origin=f"{here}._rule_factory('decoder_layer')",
            )
        )
    return specs


def call_rule_specs(row: MaxTextRow) -> list[Any]:
    """The call-rule profile: releases with the KV parameters (on older ones vllm-backport holds the rule)."""
    if not row.has_kv_params:
        from maxtext_compat.errors import ShimRefusedError

        raise ShimRefusedError(
            f"MaxText {row.name} has no KV parameters: the call rule comes with the backport there",
            argument="profile",
            expected=f"'{BACKPORT}' on MaxText {row.name}",
            found=f"'{CALL_RULE}'",
            fix=f"shims.install('{BACKPORT}') (or shims.install(convention=...), which picks it)",
        )
    return rule_specs(row)


def backport_specs(row: MaxTextRow) -> list[Any]:
    from maxtext_compat.shims import PatchSpec
    from maxtext_compat.shims import backport_hooks as hooks

    here = __name__
    specs = [s for s in hooks.specs(row) if not s.target.endswith("Attention.__call__")]
    specs += rule_specs(row)
    op = row.classes["attention_op"]
    if op is not None:
        specs.append(
            PatchSpec(f"{op}.__init__", _vllm_rpa_op_is_dot_product, origin=f"{here}._vllm_rpa_op_is_dot_product")
        )
    specs.append(
        PatchSpec(
            f"{row.config.pyconfig}:validate_attention_kernel", _accept_vllm_rpa(row), origin=f"{here}._accept_vllm_rpa"
        )
    )
    return specs
