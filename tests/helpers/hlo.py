"""Count the ops a jitted call lowers to: does an adapter add work on top of the native call?

Why count ops: an adapter that only translates arguments and picks return values must trace
to the same program as the native call. Equal op counts (by op name) of the lowered
StableHLO are a cheap, release-independent check of that (no compile, no run), and the
benchmarks report the same numbers. `stage="compiled"` counts the optimised HLO instead (XLA
may remove what the adapter added, so "lowered" is the stricter of the two).

    count = count_module_ops(model, lambda m, t, p, s: m(t, p, decoder_segment_ids=s), tokens, positions, seg)
    count.total, count.by_op["stablehlo.dot_general"]
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from maxtext_compat.errors import InvalidArgumentError

Stage = Literal["lowered", "compiled"]

# StableHLO / MLIR text: `%0 = stablehlo.add ...`, `%1:2 = "stablehlo.while"(...)`, `stablehlo.return %x`,
# `%2 = call @f(...)`, `func.func private @f(...)`, `return %0 : ...`, `sdy.sharding_constraint ...`.
_MLIR_OP = re.compile(r'^\s*(?:%[\w#.:]+(?:\s*,\s*%[\w#.:]+)*\s*=\s*)?"?([a-z_][\w]*(?:\.[\w]+)*)"?(?=[\s(<{@:]|$)')
_MLIR_SKIP = {"module", "loc", "attributes", "to", "ins", "outs", "dense", "tensor"}
# Optimised HLO text: `  %add.3 = f32[2]{0} add(f32[2]{0} %a, ...)`, `  ROOT %t = (f32[], s32[]) tuple(...)`.
_HLO_LHS = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*")
_HLO_OP = re.compile(r"([a-z][\w\-]*)\(")


@dataclass(frozen=True)
class HloOpCount:
    """Ops of one lowered/compiled program: total and per op name."""

    stage: Stage
    total: int
    by_op: Mapping[str, int] = field(default_factory=dict)

    def diff(self, other: HloOpCount) -> dict[str, tuple[int, int]]:
        """{op: (count here, count there)} for every op whose counts differ."""
        names = set(self.by_op) | set(other.by_op)
        return {
            n: (self.by_op.get(n, 0), other.by_op.get(n, 0))
            for n in sorted(names)
            if self.by_op.get(n, 0) != other.by_op.get(n, 0)
        }


def _skip_type(rest: str) -> str:
    """Drop the leading result type of an HLO instruction (a token, or a balanced '(...)' tuple)."""
    if not rest.startswith("("):
        return rest.split(" ", 1)[1] if " " in rest else ""
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[i + 1 :].lstrip()
    return ""


def count_ops_in_text(text: str, stage: Stage = "lowered") -> HloOpCount:
    """Count ops in StableHLO text (stage 'lowered') or optimised HLO text (stage 'compiled')."""
    ops: Counter[str] = Counter()
    for line in text.splitlines():
        if stage == "lowered":
            m = _MLIR_OP.match(line)
            if m and m.group(1) not in _MLIR_SKIP and not line.lstrip().startswith(("}", "^", "#", "//")):
                ops[m.group(1)] += 1
        else:
            lhs = _HLO_LHS.match(line)
            if lhs is None:
                continue
            op = _HLO_OP.match(_skip_type(line[lhs.end() :]))
            if op:
                ops[op.group(1)] += 1
    return HloOpCount(stage, sum(ops.values()), dict(ops))


def program_text(fn: Callable[..., Any], *args: Any, stage: Stage = "lowered") -> str:
    """The StableHLO (lowered) or optimised HLO (compiled) text of jax.jit(fn)(*args)."""
    import jax

    if stage not in ("lowered", "compiled"):
        raise InvalidArgumentError(
            "unknown stage",
            argument="stage",
            expected="'lowered' or 'compiled'",
            found=repr(stage),
            fix="pass stage='lowered' (StableHLO) or stage='compiled' (optimised HLO)",
        )
    lowered = jax.jit(fn).lower(*args)
    return lowered.as_text() if stage == "lowered" else lowered.compile().as_text()


def count_jit_ops(fn: Callable[..., Any], *args: Any, stage: Stage = "lowered") -> HloOpCount:
    """Ops of jax.jit(fn) lowered (or compiled) for `args` (arrays, jax.ShapeDtypeStruct or pytrees of them)."""
    return count_ops_in_text(program_text(fn, *args, stage=stage), stage)


def count_module_ops(module: Any, call: Callable[..., Any], *args: Any, stage: Stage = "lowered") -> HloOpCount:
    """Ops of `call(module, *args)` for an NNX module, jitted with the module's state as an input.

    args are traced (arrays or pytrees of arrays: tokens, KV caches, attention metadata); put
    static values (model_mode strings, flags) in `call`. Run it under the module's mesh context.
    Linen modules: count_jit_ops(lambda v, *a: module.apply(v, *a, ...), variables, *args).
    """
    from flax import nnx

    graphdef, state = nnx.split(module)

    def jitted(state: Any, *inner: Any) -> Any:
        return call(nnx.merge(graphdef, state), *inner)

    return count_jit_ops(jitted, state, *args, stage=stage)
