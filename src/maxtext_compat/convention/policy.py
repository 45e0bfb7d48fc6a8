"""Deprecation policy for old-convention calls, and strict mode for new calls.

Why per call site: a training loop calls the same layer millions of times; users want one
`DeprecationWarning` per place in *their* code that still uses the old convention, with the
migration line, and the matrix's deadline (`ends_in`) to hold whatever the filter settings.
Strict mode exists because the worst MaxText KV-cache bugs were silent (a dropped KV list
decodes garbage without an error).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from packaging.version import Version

from maxtext_compat.contract import checked
from maxtext_compat.errors import (
    InvalidArgumentError,
    OldConventionError,
    user_frame,
)
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import POLICIES, MaxTextRow
from maxtext_compat.switches import env, env_flag

POLICY_ENV = "MAXTEXT_COMPAT_DEPRECATION"
STRICT_ENV = "MAXTEXT_COMPAT_STRICT"

_lock = fork_safe_lock()
_override: dict[str, object] = {}
_seen_sites: set[tuple[str, int]] = set()


@checked
def set_deprecation_policy(policy: str | None) -> None:
    """Override the matrix row's policy for this process (None goes back to the row).

    >>> from maxtext_compat import InvalidArgumentError
    >>> from maxtext_compat.adapters import set_deprecation_policy
    >>> set_deprecation_policy("warn")  # every old call through an adapter warns once per call site
    >>> set_deprecation_policy(None)  # back to the matrix row's policy
    >>> try:
    ...     set_deprecation_policy("sometimes")
    ... except InvalidArgumentError as err:
    ...     print(err.argument)
    policy
    """
    if policy is not None and policy not in POLICIES:
        raise InvalidArgumentError(
            "unknown deprecation policy",
            argument="policy",
            expected=f"one of {list(POLICIES)}",
            found=repr(policy),
            fix="call set_deprecation_policy('ignore'), ('warn') or ('error'), or None to go back to the matrix row",
        )
    with _lock:
        _override["policy"] = policy
        _seen_sites.clear()


@checked
def set_strict(strict: bool | None) -> None:
    """Turn strict mode on/off for this process (None goes back to $MAXTEXT_COMPAT_STRICT).

    Strict mode raises KVCacheNotUpdatedError when a new call's layer returns no KV cache, or returns it unchanged
    after a step that writes it.

    >>> from maxtext_compat.adapters import set_strict
    >>> set_strict(True)
    >>> set_strict(None)
    """
    with _lock:
        _override["strict"] = strict


@contextmanager
@checked
def strict_mode(strict: bool = True) -> Iterator[None]:
    """Strict mode (see set_strict) for the duration of a `with` block; the previous setting comes back after.

    >>> from maxtext_compat.adapters import strict_mode
    >>> from maxtext_compat.convention.policy import effective_strict
    >>> with strict_mode():
    ...     effective_strict()
    True
    """
    previous = _override.get("strict")
    set_strict(strict)
    try:
        yield
    finally:
        set_strict(previous)  # type: ignore[arg-type]


def forced_policy() -> str | None:
    """The policy set for the process (set_deprecation_policy, then $MAXTEXT_COMPAT_DEPRECATION), unchecked."""
    return _override.get("policy") or env(POLICY_ENV)  # type: ignore[return-value]


def effective_policy(row: MaxTextRow, override: str | None = None) -> str:
    if override is not None:
        return override
    forced = _override.get("policy") or env(POLICY_ENV)
    if forced:
        return check_policy(str(forced))
    return row.deprecation.policy


def check_policy(raw: str) -> str:
    """`raw` as the process's deprecation policy (MAXTEXT_COMPAT_DEPRECATION), or the typed error naming it."""
    if raw not in POLICIES:
        raise InvalidArgumentError(
            f"{POLICY_ENV} is not a policy",
            argument=POLICY_ENV,
            expected=f"one of {list(POLICIES)}",
            found=repr(raw),
            fix=f"set {POLICY_ENV} to ignore, warn or error, or unset it to use the matrix row's policy",
        )
    return raw


def effective_strict(override: bool | None = None) -> bool:
    if override is not None:
        return override
    forced = _override.get("strict")
    if forced is not None:
        return bool(forced)
    return env_flag(STRICT_ENV)


def past_deadline(row: MaxTextRow) -> bool:
    """Whether `row`'s release is at or past the matrix's `ends_in` (old calls are then errors)."""
    dep = row.deprecation
    return dep.ends_in is not None and row.release >= Version(dep.ends_in)


def check_old_call(
    row: MaxTextRow, kind: str, where: str, override: str | None = None, *, deadline_passed: bool | None = None
) -> None:
    """Apply the deprecation policy to an old-convention call (the caller is two frames up).

    deadline_passed: `past_deadline(row)`, when the caller computed it once (every adapter call asks)."""
    past = past_deadline(row) if deadline_passed is None else deadline_passed
    policy = "error" if past else effective_policy(row, override)
    if policy == "ignore":
        return
    dep = row.deprecation
    message = (
        f"old call convention for {where} on MaxText {row.name}"
        + (f" (deprecated since {dep.since}" if dep.since else " (")
        + (f", removed in {dep.ends_in})" if dep.ends_in else ")")
        + f": {dep.migration}"
    )
    if policy == "error":
        raise OldConventionError(
            message,
            argument="call convention",
            expected="the new call (kv_cache= / attention_metadata=)",
            found="an old call",
            fix=dep.migration,
        )
    frame = user_frame()
    site = (frame.f_code.co_filename, frame.f_lineno)
    with _lock:
        if site in _seen_sites:
            return
        _seen_sites.add(site)
    warnings.warn_explicit(message, DeprecationWarning, site[0], site[1], module=frame.f_globals.get("__name__"))
