"""Per-request seeds in tpu-inference's sampler: a seeded request draws with a key of its own.

Why: tpu-inference 0.32.0's runner keeps one random key for the whole batch (split on every sampled step) and
`TpuPlatform.validate_request` refuses a sampled request with a `seed` ("JAX does not support per-request seed"),
which vLLM answers 500 with an empty message. Here a seeded request's token at sequence position p (the sequence's
length with that token, the runner's own count) is drawn from tpu-inference's own transformed distribution
(`_apply_sampling_transforms`: temperature, top_k, top_p, as for every other row) with the key
`fold_in(fold_in(fold_in(key(0), seed mod 2**32), seed >> 32 mod 2**32), p)`: a function of the seed and the
position alone, so the same seed gives the same text whatever else is in the batch, on any server of the same
model and stack, after a restart. Unseeded rows and the batch's shared key are left as they are.

How: the runner's `_sample_from_logits` is wrapped to note, for this step, which rows are seeded (their seed and
position, from the runner's own request states); the `sample` it calls (tpu_runner's binding only) then draws
those rows again with their keys and replaces their tokens. The fused on-device decode loop
(`enable_continue_decode`), speculative decoding and data parallelism inside one runner (tpu-inference's SPMD DP:
TPU_MULTIPROCESS_DP=0 or attention DP, whose ranks reorder the rows) sample elsewhere or reorder rows: a server
configured with one of them keeps refusing seeds (`unsupported`, from the config vLLM builds, seen through
`TpuPlatform.check_and_update_config`), and a seeded row meeting them anyway stops the step with a typed error
rather than being sampled without its seed. vLLM's own data parallelism (`vllm serve --data-parallel-size N`, one
engine core per rank: TPU_MULTIPROCESS_DP=1, tpu-inference's default there) gives each engine core a runner of DP
size 1 drawing with the same keys, so a seed gives the same text on every rank
(tests/compat/test_serving_data_parallel.py).
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maxtext_compat.errors import ServingError
from maxtext_compat.patching import Original, PatchSpec

RUNNER = "tpu_inference.runner.tpu_runner"
SAMPLE_FROM_LOGITS = f"{RUNNER}:TPUModelRunner._sample_from_logits"
SAMPLE = f"{RUNNER}:sample"  # the runner's binding only: the fused decode loop gets it too, and passes it through
CHECK_CONFIG = "tpu_inference.platforms.tpu_platform:TpuPlatform.check_and_update_config"
SAMPLING = "tpu_inference.layers.jax.sample.sampling"
SAMPLING_EPS = 1e-5  # vLLM's: below it a temperature means greedy
_MASK32 = (1 << 32) - 1

_STEP = threading.local()  # the seeded rows of the step being sampled on this thread
_SERVER: dict[str, Any] = {}  # what the config vLLM built says (this process)


def wants_seed(params: Any) -> bool:
    """A sampled request with a seed (a greedy one ignores it)."""
    temperature = float(getattr(params, "temperature", 0.0) or 0.0)
    return getattr(params, "seed", None) is not None and temperature >= SAMPLING_EPS


def unsupported() -> str | None:
    """Why this server cannot honour a per-request seed (None: it can)."""
    if _SERVER.get("speculative"):
        return "with speculative decoding (the rejection sampler draws with the batch's key)"
    if int(_SERVER.get("dp", 1) or 1) > 1:
        return (f"with data parallelism inside one engine core ({_SERVER['dp']} SPMD ranks reorder the rows; "
                "vLLM's one engine core per rank, TPU_MULTIPROCESS_DP=1, honours seeds)")  # fmt: skip
    if _SERVER.get("continue_decode"):
        return "with enable_continue_decode (the fused decode loop samples on the device)"
    return None


def _note_config(original: Original) -> Callable[..., Any]:
    def check_and_update_config(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = wrapped(*args, **kwargs)
        config = kwargs.get("vllm_config", args[0] if args else None)
        additional = getattr(config, "additional_config", None)
        _SERVER.update(
            speculative=getattr(config, "speculative_config", None) is not None,
            dp=getattr(getattr(config, "sharding_config", None), "total_dp_size", 1),
            continue_decode=isinstance(additional, dict) and bool(additional.get("enable_continue_decode", False)),
        )
        return out

    return check_and_update_config


@dataclass(frozen=True)
class _Rows:
    """The seeded rows of one step: row index, seed, position of the token drawn."""

    rows: tuple[tuple[int, int, int], ...]


def _seeded_rows(runner: Any, scheduler_output: Any) -> _Rows:
    batch = runner.input_batch
    rows = []
    for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
        state = runner.requests.get(req_id) if req_id is not None else None
        params: Any = getattr(state, "sampling_params", None)
        if state is not None and wants_seed(params):
            position = int(state.num_computed_tokens) + int(scheduler_output.num_scheduled_tokens[req_id])
            rows.append((i, int(params.seed), position))
    return _Rows(tuple(rows))


def _sample_from_logits_factory(original: Original) -> Callable[..., Any]:
    import inspect

    signature = inspect.signature(original.function)

    def sample_from_logits(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = signature.bind(instance, *args, **kwargs)
        found = _seeded_rows(instance, bound.arguments["scheduler_output"])
        if not found.rows:
            return wrapped(*args, **kwargs)
        why = unsupported()
        if why is None and bound.arguments.get("spec_decode_metadata") is not None:
            why = "with speculative decoding"
        if why is None and (bound.arguments.get("logits_indices_selector") is not None or instance.dp_size > 1):
            why = "with data parallelism"
        if why is not None:
            raise ServingError(
                f"a request with a seed reached tpu-inference's sampler {why}: it would be sampled without its seed",
                argument="seed",
                expected="a server without speculative decoding, data parallelism or enable_continue_decode",
                found=why,
                fix="send sampled requests without seed to this server",
            )
        _STEP.rows = found
        try:
            return wrapped(*args, **kwargs)
        finally:
            _STEP.rows = None

    return sample_from_logits


@functools.cache
def _draw_fn() -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    transforms = importlib.import_module(SAMPLING)._apply_sampling_transforms

    @functools.partial(jax.jit, static_argnames=("mesh",))
    def draw(mesh: Any, logits: Any, metadata: Any, words: Any, mask: Any, tokens: Any) -> Any:
        processed = transforms(logits.astype(jnp.float32), metadata)

        def one(w: Any, row: Any) -> Any:
            key = jax.random.key(0)
            for i in range(3):  # seed's low word, its high word, the position
                key = jax.random.fold_in(key, w[i])
            return jax.random.categorical(key, row)

        drawn = jax.vmap(one)(words, processed).astype(tokens.dtype)
        out = jnp.where(mask, drawn, tokens)
        return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, PartitionSpec()))

    return draw


def _sample_factory(original: Original) -> Callable[..., Any]:
    _draw_fn()  # the transforms must be there when the patch goes in, not at the first seeded request

    def sample(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        found = getattr(_STEP, "rows", None)
        if found is None:
            return wrapped(*args, **kwargs)
        _STEP.rows = None  # one draw per step: the runner calls sample once outside speculative decoding
        import numpy as np

        tokens, processed = wrapped(*args, **kwargs)
        named = dict(zip(("rng", "mesh", "logits", "tpu_sampling_metadata"), args, strict=False)) | kwargs
        mesh, logits, metadata = named["mesh"], named["logits"], named["tpu_sampling_metadata"]
        words = np.zeros((logits.shape[0], 3), np.uint32)
        mask = np.zeros((logits.shape[0],), np.bool_)
        for row, seed, position in found.rows:
            words[row] = (seed & _MASK32, (seed >> 32) & _MASK32, position & _MASK32)
            mask[row] = True
        return _draw_fn()(mesh, logits, metadata, words, mask, tokens), processed

    return sample


def specs() -> list[PatchSpec]:
    origin = f"{__name__}"
    return [
        PatchSpec(CHECK_CONFIG, _note_config, origin=f"{origin} (notes what refuses seeds)"),
        PatchSpec(SAMPLE_FROM_LOGITS, _sample_from_logits_factory, origin=f"{origin} (the step's seeded rows)"),
        PatchSpec(SAMPLE, _sample_factory, aliases=(), origin=f"{origin} (seeded rows drawn with their own keys)"),
    ]
