"""Checks of what `maxtext-compat serve` is given, before vLLM starts (pure Python, no jax).

Why up front: vLLM takes ~40 s to start on this machine and reports a bad model directory or a
bad `--additional-config` as a raw traceback from deep inside its engine (or, for some values,
not at all: `1.5` layers became 1, a duplicated JSON key kept only the last value). Every value
`serve` reads is checked here and refused with a typed error naming the flag, the value and the
fix; the flags `serve` does not read pass through to vLLM untouched.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
from maxtext_compat.serving.model_dir import MAXTEXT_CONFIG

ARCH = "MaxTextForCausalLM"
MAX_JSON_DEPTH = 32  # maxtext_config is a flat mapping; 32 levels leave room for any nested option
MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few kB
MAX_PARALLELISM = 4096


def positive_int(flag: str, raw: str, *, maximum: int = MAX_PARALLELISM) -> int:
    """`raw` as an int in [1, maximum]; ASCII digits only (int() would take '２' or ' 2_0 ')."""
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:
        raise InvalidArgumentError(
            f"{flag} must be a whole number from 1 to {maximum}",
            argument=flag,
            expected=f"1 ... {maximum} in ASCII digits, e.g. 2",
            found=repr(raw),
            fix=f"pass e.g. {flag} 2",
        )
    return int(raw)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} (only the last value would be kept)")
        out[key] = value
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a float")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _strict_json(raw: str) -> tuple[Any, str | None]:
    """(value, None), or (None, what is wrong): no NaN/Infinity, no duplicate keys, no non-finite floats
    or oversized integers, at most MAX_JSON_DEPTH levels."""
    try:
        data = json.loads(raw, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        return None, f"nested more than Python can parse (limit {MAX_JSON_DEPTH} levels)"
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at position {exc.pos}"
    except ValueError as exc:  # our hooks, and integers over Python's 4300-digit limit
        return None, str(exc)
    if _depth(data) > MAX_JSON_DEPTH:
        return None, f"nested {_depth(data)} levels deep (limit {MAX_JSON_DEPTH})"
    return data, None


def parse_additional_config(raw: str, flag: str = "--additional-config") -> dict[str, Any]:
    """The JSON object of `--additional-config`, strictly parsed: no NaN/Infinity, no duplicate keys,
    no non-finite floats or oversized integers, at most MAX_JSON_DEPTH levels, maxtext_config an object."""
    example = '{"maxtext_config": {"model_name": "default"}}'
    data, problem = _strict_json(raw)
    if problem is not None:
        raise InvalidArgumentError(
            f"{flag} is not valid JSON for vLLM's additional_config",
            argument=flag,
            expected=f"a JSON object such as {example}",
            found=f"{raw[:200]!r}: {problem}",
            fix="fix the JSON (quote it for your shell: --additional-config '{...}')",
        )
    if not isinstance(data, dict):
        raise InvalidArgumentTypeError(
            f"{flag} must be a JSON object",
            argument=flag,
            expected=f"a JSON object such as {example}",
            found=f"a JSON {type(data).__name__}",
            fix="wrap the settings in a JSON object: --additional-config '{\"maxtext_config\": {...}}'",
        )
    mt = data.get("maxtext_config")
    if mt is not None and not isinstance(mt, dict):
        raise InvalidArgumentTypeError(
            f"{flag}: maxtext_config must be a JSON object of MaxText config keys",
            argument=f"{flag} maxtext_config",
            expected='{"maxtext_config": {"model_name": "default", ...}}',
            found=f"a JSON {type(mt).__name__}: {json.dumps(mt)[:100]}",
            fix="pass MaxText keys inside the maxtext_config object",
        )
    return data


def int_setting(maxtext: Mapping[str, Any], key: str, *, minimum: int = 1, flag: str = "--additional-config") -> int:
    """maxtext_config[key] as an int >= minimum: a JSON integer (not true/false, not 1.5, not "8")."""
    value = maxtext[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(
            f"maxtext_config.{key} must be a whole number >= {minimum}",
            argument=f"{flag} maxtext_config.{key}",
            expected=f"a JSON integer >= {minimum}",
            found=json.dumps(value),
            fix=f'e.g. {{"maxtext_config": {{"{key}": {max(minimum, 2)}}}}}',
        )
    return value


def _read_regular(path: Path, what: str, argument: str) -> str:
    """The text of a regular file of at most MAX_CONFIG_BYTES (a FIFO or /dev/zero would hang)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise InvalidArgumentError(
            f"the model directory has no {what}",
            argument=argument,
            expected=f"{path} (a JSON file naming {ARCH})",
            found=f"{type(exc).__name__}: {exc.strerror}",
            fix="point serve at a model directory with config.json, or use --tiny",
        ) from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
        raise InvalidArgumentError(
            f"{what} is not a regular file of at most {MAX_CONFIG_BYTES} bytes",
            argument=argument,
            expected="a JSON file",
            found=f"{path} ({st.st_size} bytes, mode {stat.filemode(st.st_mode)})",
            fix=f"write a config.json naming {ARCH} into the model directory",
        )
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"{what} is not UTF-8 text",
            argument=argument,
            expected="a UTF-8 JSON file",
            found=str(exc),
            fix=f"rewrite {path} as UTF-8 JSON",
        ) from None


def check_model_dir(model: str) -> dict[str, Any]:
    """config.json of the served model directory: it exists, is a JSON object and names MaxTextForCausalLM."""
    path = Path(model)
    if not path.is_dir():
        raise InvalidArgumentError(
            "the model is not a local directory",
            argument="model",
            expected=f"a directory whose config.json names {ARCH}",
            found=f"{model!r} ({'a file' if path.exists() else 'does not exist'})",
            fix="pass the model directory (download hub models first), or use --tiny for the tiny test model",
        )
    cfg_file = path / "config.json"
    text = _read_regular(cfg_file, "config.json", "model")
    try:
        cfg = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgumentError(
            "the model directory's config.json is not valid JSON",
            argument="model",
            expected="a JSON object",
            found=f"{cfg_file}: {exc}",
            fix=f"fix {cfg_file}",
        ) from None
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    if not isinstance(archs, list) or ARCH not in archs:
        raise InvalidArgumentError(
            f"the model directory's config.json does not name {ARCH}",
            argument="model",
            expected=f'"architectures": ["{ARCH}"]',
            found=f"{cfg_file}: architectures {json.dumps(archs)}"
            if isinstance(cfg, dict)
            else f"{cfg_file}: a JSON {type(cfg).__name__}",
            fix=f'set "architectures": ["{ARCH}"] in {cfg_file} (maxtext-compat serves MaxText models), or use --tiny',
        )
    return cfg


def read_maxtext_config(model: str) -> dict[str, Any] | None:
    """The maxtext_config.json `maxtext-compat convert` wrote into `model` (None when there is none), read as
    strictly as config.json and --additional-config."""
    path = Path(model) / MAXTEXT_CONFIG
    if not path.exists():
        return None
    data, problem = _strict_json(_read_regular(path, MAXTEXT_CONFIG, MAXTEXT_CONFIG))
    if problem is not None or not isinstance(data, dict):
        raise InvalidArgumentError(
            f"{path} is not a JSON object of MaxText config keys",
            argument=MAXTEXT_CONFIG,
            expected="a JSON object, as maxtext-compat convert writes it",
            found=problem if problem is not None else f"a JSON {type(data).__name__}",
            fix="re-run maxtext-compat convert, or delete the file and pass --additional-config",
        )
    return data
