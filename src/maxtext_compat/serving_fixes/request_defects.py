"""Request features tpu-inference's runner drops or fails on: worked around, or refused with vLLM's 400.

Why: the OpenAI API surface of `vllm serve` is vLLM's, but sampling runs in tpu-inference's runner, and with
tpu-inference 0.32.0 some request fields fail there or are silently dropped -- for any model it serves, its own
Llama as well as MaxText (tests/compat/test_serving_conformance.py compares the two). Each such defect is a
`known_defects` entry of the installed tpu-inference range in compat_matrix.yaml (what, upstream file and line,
when); this module holds how each is handled, by id:
- fixed (`FIXES`): wrappers that make the feature work (logprobs=0; per-request seeds: `serving_fixes.seeded_sampling`,
  refused where that server cannot honour them);
- refused (`REFUSALS`): a check run where vLLM validates a request (`TpuPlatform.validate_request`, in the API
  server, before the request reaches the engine) that raises `RequestRefusedError`, which is also vLLM's
  `VLLMValidationError`: the client gets a 400 naming the parameter, the defect and the fix, instead of an
  answer that ignored what it asked for (penalties, logit_bias, allowed_token_ids, bad_words, min_p, min_tokens).
Installed by the vLLM plugin in every vLLM process (TPU or CPU: the defects are the stack's, not the CPU's);
`MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM=1` leaves it out (to see the stack's own behaviour).
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maxtext_compat import names
from maxtext_compat.errors import RequestRefusedError
from maxtext_compat.patching import Original, PatchSpec, profiles
from maxtext_compat.patching.shim import Shim
from maxtext_compat.patching.shim import status_of as shim_status
from maxtext_compat.patching.shim import uninstall as shim_uninstall
from maxtext_compat.serving_fixes import seeded_sampling

PROFILE = names.SERVING_REQUESTS
DISABLE_ENV = "MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM"
VALIDATE = "tpu_inference.platforms.tpu_platform:TpuPlatform.validate_request"
SAMPLING_METADATA = "tpu_inference.layers.jax.sample.sampling_metadata:TPUSupportedSamplingMetadata.from_input_batch"
SAMPLING_EPS = 1e-5  # vLLM's: below it a temperature means greedy
SEED = "per-request-seed"

log = logging.getLogger("vllm.maxtext_compat.serving_requests")


# --------------------------------------------------------------------------------------------
# Refusals: what of a request hits each refused defect
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """The request field that meets a refused defect, its value, and how to send the request instead."""

    parameter: str
    value: Any
    fix: str


def _seed(p: Any) -> Hit | None:
    if getattr(p, "seed", None) is not None and float(getattr(p, "temperature", 0.0) or 0.0) >= SAMPLING_EPS:
        return Hit("seed", p.seed, "leave seed out (sampling then follows the server's --seed), or use temperature 0")
    return None


def _penalties(p: Any) -> Hit | None:
    neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0}
    for name, value in neutral.items():
        got = getattr(p, name, value)
        if got is not None and float(got) != value:
            return Hit(name, got, f"leave {name} at {value:g} (its neutral value)")
    return None


def _token_constraints(p: Any) -> Hit | None:
    for name in ("logit_bias", "allowed_token_ids", "bad_words"):
        got = getattr(p, name, None)
        if got:
            return Hit(name, got, f"leave {name} out, or apply it in the client")
    return None


def _min_tokens(p: Any) -> Hit | None:
    got = int(getattr(p, "min_tokens", 0) or 0)
    stops = getattr(p, "stop_token_ids", None) or []
    if got > 0 and not (getattr(p, "ignore_eos", False) and not stops):
        return Hit("min_tokens", got, "leave min_tokens out, or send ignore_eos=true without stop_token_ids")
    return None


REFUSALS: dict[str, Callable[[Any], Hit | None]] = {
    SEED: _seed,  # where the matrix says refuse; fixed by serving_fixes.seeded_sampling where it says fix
    "sampler-ignores-penalties": _penalties,
    "sampler-ignores-token-constraints": _token_constraints,
    "min-tokens-not-enforced": _min_tokens,
}


@functools.cache
def _http_error_class() -> type[RequestRefusedError]:
    """RequestRefusedError that is also vLLM's VLLMValidationError (vLLM answers those with a 400); without vLLM
    (no server to answer) the plain class."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        return RequestRefusedError

    class ServedRequestRefusedError(RequestRefusedError, VLLMValidationError):
        def __init__(self, message: str, **kw: Any) -> None:
            RequestRefusedError.__init__(self, message, **kw)
            self.parameter = kw.get("argument")
            self.value = None  # the message names it (Found: ...)

        def __str__(self) -> str:
            return RequestRefusedError.__str__(self)

    ServedRequestRefusedError.__qualname__ = ServedRequestRefusedError.__name__ = "RequestRefusedError"
    return ServedRequestRefusedError


def refusal(defect: Any, tpu_inference: str, hit: Hit) -> RequestRefusedError:
    """The error for a request that meets `defect` (a matrix KnownDefect) through `hit`."""
    # As a dotted module and line: vLLM's error bodies replace anything that looks like a file path by <path>.
    where = f" ({defect.upstream.replace('/', '.').replace('.py:', ' line ')})" if defect.upstream else ""
    return _http_error_class()(
        f"known defect {defect.id} of tpu-inference {tpu_inference}: {defect.summary}{where}",
        argument=hit.parameter,
        expected="a request without it on this server",
        found=repr(hit.value),
        fix=hit.fix,
    )


def check_request(defects: list[Any], tpu_inference: str, params: Any) -> None:
    """Raise for the first refused defect in `defects` that `params` (vLLM SamplingParams) meets."""
    for defect in defects:
        check = REFUSALS.get(defect.id) if defect.remedy == "refuse" else None
        hit = None if check is None else check(params)
        if hit is not None:
            raise refusal(defect, tpu_inference, hit)


def _seed_served(seed: Any, tpu_inference: str, params: Any) -> Any:
    """The params tpu-inference's own check gets for a seeded request this server honours (the seed taken out:
    the check refuses any); a refusal where it cannot (`seeded_sampling.unsupported`)."""
    why = seeded_sampling.unsupported()
    if why is not None:
        raise refusal(seed, tpu_inference, Hit("seed", params.seed, f"leave seed out on this server ({why})"))
    try:
        import msgspec
    except ImportError:  # no vLLM: a plain object stands for the params
        msgspec = None
    if msgspec is not None and isinstance(params, msgspec.Struct):
        return msgspec.structs.replace(params, seed=None)  # its cached sampling_type is computed afresh
    out = copy.copy(params)
    out.seed = None
    return out


def _validate_factory(defects: list[Any], seed: Any, tpu_inference: str) -> Callable[[Original], Callable[..., Any]]:
    def factory(original: Original) -> Callable[..., Any]:
        def validate_request(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            params = kwargs.get("params", args[1] if len(args) > 1 else None)
            if disabled():  # set after the shim went in: --additional-config read by an API server set up before
                return wrapped(*args, **kwargs)
            if params is not None and hasattr(params, "temperature"):  # SamplingParams (not PoolingParams)
                check_request(defects, tpu_inference, params)
                if seed is not None and seeded_sampling.wants_seed(params):
                    checked = _seed_served(seed, tpu_inference, params)
                    if "params" in kwargs:
                        kwargs = {**kwargs, "params": checked}
                    else:
                        args = (args[0], checked, *args[2:])
            return wrapped(*args, **kwargs)

        return validate_request

    return factory


# --------------------------------------------------------------------------------------------
# Fixes
# --------------------------------------------------------------------------------------------


class _AskedLogprobs:
    """An input batch seen by `from_input_batch` with logprobs=0 counted as asked for (max 1 instead of 0)."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    @property
    def max_num_logprobs(self) -> int | None:
        found = self._batch.max_num_logprobs
        return None if found is None else max(found, 1)


def _logprobs_zero_factory(original: Original) -> Callable[..., Any]:
    def from_input_batch(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = "input_batch"
        if name in kwargs:
            kwargs = {**kwargs, name: _AskedLogprobs(kwargs[name])}
        elif len(args) > 1:
            args = (args[0], _AskedLogprobs(args[1]), *args[2:])
        return wrapped(*args, **kwargs)

    return from_input_batch


FIXES: dict[str, Callable[[], list[PatchSpec]]] = {
    "logprobs-zero-returns-none": lambda: [
        PatchSpec(SAMPLING_METADATA, _logprobs_zero_factory, origin=f"{__name__} (fixes logprobs-zero-returns-none)")
    ],
    SEED: seeded_sampling.specs,  # validate_request lets the request through (_seed_served)
}


# --------------------------------------------------------------------------------------------
# Which defects apply, and the profile
# --------------------------------------------------------------------------------------------


def applicable(resolution: Any = None) -> tuple[str, list[Any]]:
    """(installed tpu-inference version, the known defects of its matrix range that apply to it)."""
    from maxtext_compat.resolution import defects as known

    if resolution is None:
        from maxtext_compat.resolution.installed import installed_resolution

        resolution = installed_resolution().resolution
    row = resolution.tpu_inference
    found = resolution.versions.get("tpu_inference")
    if row is None or found is None:
        return ("?" if found is None else str(found.version)), []
    version = known.installed_tpu_inference()
    out = [d for d in row.known_defects if known.version_status(d, version)[0] != "no"]
    return str(found.version), out


def _specs(tpu_inference: str, defects: list[Any]) -> list[PatchSpec]:
    specs = []
    origin = f"{__name__}"
    refused = [d for d in defects if d.remedy == "refuse" and d.id in REFUSALS]
    seed = next((d for d in defects if d.id == SEED and d.remedy == "fix"), None)
    if refused or seed is not None:
        ids = ", ".join(d.id for d in refused) or "none"
        what = f"{origin} (refuses {ids}" + ("; lets per-request seeds through)" if seed is not None else ")")
        specs.append(PatchSpec(VALIDATE, _validate_factory(refused, seed, tpu_inference), origin=what))
    for defect in defects:
        if defect.remedy == "fix" and defect.id in FIXES:
            specs.extend(FIXES[defect.id]())
    return specs


def disabled() -> bool:
    from maxtext_compat.switches import parse_flag

    return parse_flag(DISABLE_ENV, os.environ.get(DISABLE_ENV))


class RequestDefectsShim(Shim):
    """The known request defects of the installed tpu-inference (its matrix row), each refused with a 400 or
    fixed, in one patch set."""

    name = PROFILE
    description = "request features tpu-inference drops or fails on"
    verified_for = (names.TPU_INFERENCE_RELEASES,)  # the defects each tpu-inference row of the matrix lists

    def __init__(self, resolution: Any = None) -> None:
        self.version, defects = applicable(resolution)
        self.handled = [d for d in defects if d.id in REFUSALS or d.id in FIXES]
        self.unhandled = [d.id for d in defects if d not in self.handled]

    def applies(self) -> str | None:
        if disabled():
            log.warning("maxtext_compat: %s is set: request defects of the stack are neither fixed nor refused",
                        DISABLE_ENV)  # fmt: skip
            return f"{DISABLE_ENV} is set"
        if not self.handled:
            return f"no known request defect of tpu-inference {self.version} to handle"
        return None

    def specs(self) -> list[PatchSpec]:
        return _specs(self.version, self.handled)

    def facts(self) -> dict[str, Any]:
        return {"handled": [d.id for d in self.handled], "tpu_inference": self.version}

    def installed_now(self, patch_set: Any) -> None:
        if self.unhandled:
            log.warning("maxtext_compat: known defects with no handler here: %s", self.unhandled)
        log.info("maxtext_compat: request defects of tpu-inference %s handled: %s", self.version,
                 ", ".join(d.id for d in self.handled))  # fmt: skip


def install(resolution: Any = None) -> list[str]:
    """Apply the handling of every applicable stack defect in this process (idempotent); the ids handled."""
    status = RequestDefectsShim(resolution).install() if not profiles.installed(PROFILE) else shim_status(PROFILE)
    return list(status.facts.get("handled", ())) if status.active else []


def uninstall() -> None:
    shim_uninstall(PROFILE)
