"""The KV-write checks for a new-convention call that goes straight to MaxText (its own vLLM path).

Why: on a release with the vLLM path the adapter hands kv_cache / attention_metadata to MaxText, which
hands them to tpu-inference's kernel; nothing of ours sees them on the way, and the kernel trusts its
metadata. These are the same checks the dispatcher runs (paged.metadata_checks), applied at the call:
- eager (concrete values): the metadata against every cache it writes, and the call's positions, before
  anything runs; a typed error names the bad argument;
- traced (inside jit): the values do not exist yet, so a host callback runs the same checks when the
  step executes; a bad step then fails as a JAX runtime error carrying the typed error's message, and
  its outputs (the new caches) are never returned. The callback is the only op the adapter adds to a
  jitted new call. MAXTEXT_COMPAT_TRACED_KV_CHECKS=1 or 0 puts it in or leaves it out; unset, it is in
  where JAX's default backend is the CPU and out on an accelerator (said once in the log), where its
  host round trip is paid by every step whose outputs are waited for: measured on a TPU v5e, SmolLM2's
  decode step went from 3.5 to 12.5 ms with it (docs/accelerators.md). A host callback runs on JAX's CPU
  backend: with JAX_PLATFORMS naming only an accelerator a checked step is refused when traced (typed error).
Metadata converted from our RaggedMetadata also checks that its requests were not freed since and that
it was built for this cache's page size.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from maxtext_compat.errors import InvalidArgumentError, KernelUnavailableError
from maxtext_compat.paged.metadata import check_metadata, metadata_arrays, source_of
from maxtext_compat.switches import env, env_flag

log = logging.getLogger(__name__)

# Off: a jitted step holds no host callback (the adapter then adds no op to MaxText's own program), and its
# metadata is checked only where it is concrete (eager calls, the dispatcher). Unset: traced_checks_on().
TRACED_CHECKS_ENV = "MAXTEXT_COMPAT_TRACED_KV_CHECKS"
NO_ROW_LIMIT = 2**31 - 1  # no positions given: the token rows are not known here (the kernel's int32 bound)


def _concrete(x: Any) -> bool:
    import jax

    return not isinstance(x, jax.core.Tracer)


def check_writes_described(caches: Sequence[Any], metadata: Any, positions: Any, where: str) -> None:
    """Refuse a KV write the metadata does not describe exactly (see the module docstring)."""
    shapes = {tuple(c.shape) for c in caches}
    if len(shapes) != 1 or len(next(iter(shapes))) < 2:
        raise InvalidArgumentError(
            f"{where}: every KV cache of one call must have one paged shape",
            argument="kv_cache",
            expected="arrays of one shape [pages, page_size, ...] (maxtext_compat.paged.KVCacheLayout.allocate)",
            found=f"shapes {sorted(shapes)}",
            fix="allocate all layers' caches from one KVCacheLayout",
        )
    num_pages, page_size = next(iter(shapes))[:2]
    source = source_of(metadata)
    if source is not None:
        source.check_current("attention_metadata")
        source.check_cache(num_pages, page_size, "attention_metadata")
    values = (*metadata_arrays(metadata), positions)
    check = functools.partial(_check_values, num_pages=num_pages, page_size=page_size)
    if all(v is None or _concrete(v) for v in values):
        check(*values)
        return
    if not traced_checks_on():
        return  # a step with no host callback in it (MAXTEXT_COMPAT_TRACED_KV_CHECKS=0, or an accelerator's default)
    import jax

    _require_host_backend(where)
    jax.debug.callback(check, *values)


def traced_checks_on() -> bool:
    """Whether a jitted new call carries the host-callback check: MAXTEXT_COMPAT_TRACED_KV_CHECKS when set; unset,
    on where JAX's default backend is the CPU (the callback is a direct call there) and off on an accelerator."""
    import jax

    backend = jax.default_backend()
    on = env_flag(TRACED_CHECKS_ENV, default=backend == "cpu")
    if not on and backend != "cpu" and env(TRACED_CHECKS_ENV) in (None, ""):
        _say_off_by_default(backend)
    return on


@functools.cache
def _say_off_by_default(backend: str) -> None:
    log.info("maxtext_compat: the traced KV-write check is off on %s by default (its host round trip would be paid "
             "by every step); jitted steps' metadata is not checked on the device. %s=1 turns it on",
             backend, TRACED_CHECKS_ENV)  # fmt: skip


@functools.cache
def _host_backend_present() -> bool:
    import jax

    try:
        return bool(jax.devices("cpu"))
    except RuntimeError:  # JAX_PLATFORMS names the accelerator alone: no CPU backend was initialized
        return False


def _require_host_backend(where: str) -> None:
    """Refuse at trace time what would fail at run time: a host callback needs JAX's CPU backend."""
    if _host_backend_present():
        return
    import os

    raise KernelUnavailableError(
        f"{where}: the traced KV-write check runs as a host callback, which needs JAX's CPU backend",
        argument="JAX_PLATFORMS",
        expected="a platform list that includes cpu (e.g. tpu,cpu)",
        found=repr(os.environ.get("JAX_PLATFORMS", "")),
        fix=f"set JAX_PLATFORMS=tpu,cpu (or cuda,cpu) before JAX starts, or {TRACED_CHECKS_ENV}=0 to leave the "
        "check out of jitted steps",
    )


def _check_values(
    kv_lens: Any, page_indices: Any, cu_q_lens: Any, distribution: Any, positions: Any, *, num_pages: int,
    page_size: int,
) -> None:  # fmt: skip
    import numpy as np

    flat = None if positions is None else np.asarray(positions).reshape(-1).tolist()
    check_metadata(
        np.asarray(kv_lens).tolist(),
        np.asarray(page_indices).reshape(-1).tolist(),
        np.asarray(cu_q_lens).tolist(),
        np.asarray(distribution).tolist(),
        num_pages=int(num_pages),
        page_size=int(page_size),
        max_num_tokens=NO_ROW_LIMIT if flat is None else max(1, len(flat)),
        input_positions=flat,
        positions_name="positions",
    )
