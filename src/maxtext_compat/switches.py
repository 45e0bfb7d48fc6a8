"""One strict parser for every environment switch: on/off flags (MAXTEXT_COMPAT_STRICT, ...) and amounts.

Why strict: a switch read loosely fails silently. `MAXTEXT_COMPAT_STRICT=" 1"`, `"y"` or `"2"`
used to turn strict mode *off* without a word; a value we do not recognise is now a typed
error naming the variable, the value and the values accepted. Unset or empty means the default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from maxtext_compat.errors import InvalidArgumentError

TRUE: tuple[str, ...] = ("1", "true", "yes", "on")
FALSE: tuple[str, ...] = ("0", "false", "no", "off")
# tpu-inference's own switches (NEW_MODEL_DESIGN, ...) accept only these (tpu_inference.envs.env_bool).
TPU_INFERENCE_TRUE: tuple[str, ...] = ("1", "true")
TPU_INFERENCE_FALSE: tuple[str, ...] = ("0", "false")


def parse_flag(
    name: str,
    raw: str | None,
    default: bool = False,
    *,
    true: tuple[str, ...] = TRUE,
    false: tuple[str, ...] = FALSE,
) -> bool:
    """`raw` (the value of variable `name`) as a bool; unset/empty -> `default`; anything else -> error.

    Case does not matter; whitespace does (`" 1"` is refused, not read as off)."""
    if raw is None or raw == "":
        return default
    low = raw.lower()
    if low in true:
        return True
    if low in false:
        return False
    raise InvalidArgumentError(
        f"{name} is an on/off switch and its value is not one",
        argument=name,
        expected=f"one of {', '.join(true)} (on) or {', '.join(false)} (off), in any case, or unset",
        found=repr(raw),
        fix=f"set {name}={true[0]} to switch it on, or {name}={false[0]} (or unset it) to switch it off",
    )


# Install shims outside the releases they were verified on (Shim.verified_for) where a program installs them for the
# user: the vLLM plugin's shims in every process it loads into, and the served output head. Off: ShimRefusedError.
FORCE_SHIMS_ENV = "MAXTEXT_COMPAT_FORCE_SHIMS"


def force_shims(environ: Mapping[str, str] | None = None) -> bool:
    """MAXTEXT_COMPAT_FORCE_SHIMS: `force=True` for the shims the vLLM plugin installs (a release newer than the
    matrix knows, tried anyway)."""
    return env_flag(FORCE_SHIMS_ENV, environ=environ)


def env(name: str) -> str | None:
    """`os.environ.get(name)`: the one read of a switch, so a test can hold every caller to it."""
    return os.environ.get(name)


def env_flag(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """The on/off switch `name` from the environment (see parse_flag)."""
    return parse_flag(name, env(name) if environ is None else environ.get(name), default)


def env_positive_number(
    name: str,
    *,
    example: str,
    default: str,
    maximum: float,
    value: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> float | None:
    """Variable `name` (or `value`, when given) as a finite number in (0, maximum]; None when unset or empty
    (the caller's `default` applies). nan, inf and 1e400 parse as floats: they are refused here."""
    raw = (os.environ if environ is None else environ).get(name, "") if value is None else value
    if raw == "":
        return None
    try:
        number = float(raw)
    except ValueError:
        number = -1.0
    if not (math.isfinite(number) and 0 < number <= maximum):
        raise InvalidArgumentError(
            f"{name} is not a positive number up to {maximum:g}",
            argument=name,
            expected=f"a number > 0 and <= {maximum:g}, e.g. {example}",
            found=repr(raw),
            fix=f"set {name}={example}, or unset it for {default}",
        )
    return number


def env_count(name: str, *, default: int, maximum: int, environ: Mapping[str, str] | None = None) -> int:
    """Variable `name` as a whole number in [1, maximum]; `default` when unset or empty. `int()` alone would
    turn "2,000" or "1e4" into a bare ValueError that names no variable, and "0" into a run that checks nothing."""
    raw = (os.environ if environ is None else environ).get(name, "")
    if raw == "":
        return default
    number = int(raw) if raw.isascii() and raw.isdecimal() else 0
    if not 1 <= number <= maximum:
        raise InvalidArgumentError(
            f"{name} is not a whole number from 1 to {maximum:,}",
            argument=name,
            expected=f"digits only, 1 to {maximum:,} (e.g. {default})",
            found=repr(raw),
            fix=f"set {name}={default}, or unset it for {default}",
        )
    return number
