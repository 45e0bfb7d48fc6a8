"""Meshes the RPA kernel cannot run with on a given jax: one table for every path that builds one.

Why one table: the dispatcher (`rpa`) and a vLLM server on CPU (tpu-inference calls its kernel past
the dispatcher; `cpu.serving` builds its mesh) must refuse the same cases with the same words.
Each limit was measured on the kernel tests' installs; a wrong KV cache with no error, or a hang, is
the outcome a refusal replaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.version import Version

from maxtext_compat.errors import KernelUnavailableError

Case = Literal["tensor parallelism", "replicated KV heads"]


@dataclass(frozen=True)
class MeshLimit:
    """A mesh `case` fails on jax below `min_jax` (in interpret mode only, or on any backend), because `why`."""

    case: Case
    min_jax: str
    interpret_only: bool
    why: str


LIMITS: tuple[MeshLimit, ...] = (
    # TP=2, the same step 30 times per jax: one device's cache rows for a token lost (output right) in 2 runs on
    # 0.7.2 and 3 on 0.8.0, none on 0.8.1 or 0.9.2. 0.8.1 runs the same patched interpreter and 30 clean runs do
    # not rule out that rate: refused too.
    MeshLimit("tensor parallelism", "0.9", True, "the Pallas TPU interpreter loses KV cache writes"),
    # TP above the KV head count holds each head several times.
    MeshLimit("replicated KV heads", "0.10", False,
              "its sharding conversion fails on the kernel's output (IndivisibleError)"),
    MeshLimit("replicated KV heads", "0.11.2", True, "the Pallas TPU interpreter deadlocks in the kernel"),
)  # fmt: skip


def check_mesh(tp: int, *, interpret: bool, jax_version: str, num_kv_heads: int | None = None) -> None:
    """Raise KernelUnavailableError [mesh] when `tp` (the 'model' axis) cannot run the kernel on `jax_version`.

    num_kv_heads=None (a server's mesh, built before the model is known) checks the cases that need no heads."""
    if tp <= 1:  # no limit touches one device; the dispatcher calls this every step
        return
    version = Version(jax_version)
    for limit in LIMITS:
        if (limit.interpret_only and not interpret) or version >= Version(limit.min_jax):
            continue
        if limit.case == "tensor parallelism":
            raise _refusal(
                limit, jax_version, interpret,
                expected=f"a 'model' axis of 1 on jax < {limit.min_jax}",
                found=f"'model' axis {tp}",
                fix=f"use tensor parallelism 1{_or_jax(limit, interpret)}",
            )  # fmt: skip
        if limit.case == "replicated KV heads" and num_kv_heads is not None and tp > num_kv_heads:
            raise _refusal(
                limit, jax_version, interpret,
                expected=f"a 'model' axis of at most {num_kv_heads} (the KV heads) on jax < {limit.min_jax}",
                found=f"'model' axis {tp} over {num_kv_heads} KV heads (each held {tp // num_kv_heads} times)",
                fix=f"use tensor parallelism <= {num_kv_heads}{_or_jax(limit, interpret)}",
            )  # fmt: skip


def _or_jax(limit: MeshLimit, interpret: bool) -> str:
    """The jax that runs the case: past every limit of the case that applies in this mode."""
    needed = max(Version(x.min_jax) for x in LIMITS if x.case == limit.case and (interpret or not x.interpret_only))
    return f", or jax >= {needed}"


def _refusal(limit: MeshLimit, jax_version: str, interpret: bool, *, expected: str, found: str, fix: str) -> Exception:
    mode = " in interpret mode (CPU)" if interpret else ""
    return KernelUnavailableError(
        f"{limit.case} over the 'model' axis cannot run the RPA kernel on jax {jax_version}{mode}: {limit.why}",
        argument="mesh",
        expected=expected,
        found=found,
        fix=fix,
    )
