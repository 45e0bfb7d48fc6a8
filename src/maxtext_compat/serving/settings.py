"""Every MAXTEXT_COMPAT_* setting that changes what a vLLM process of the plugin does, in one registry.

Why: vLLM loads the plugin in every engine core and worker process, but Ray copies only VLLM_*, HF_* and the
platform's `additional_env_vars` to workers on other hosts, so a setting made on the head host's environment
silently does not reach them. Each setting here can also be given in vLLM's own config, which vLLM ships to every
worker: `--additional-config '{"maxtext_compat": {"rpa_kernel": "xla"}}'`. `apply()` makes those values the
process's environment (the code that reads each setting reads it there), refusing an unknown key, a bad value, or
a value the process's environment already contradicts, each with a typed error.

Each setting's parser is the one its reader uses (platforms.kernel_choice, platforms.disabled_parts, ...), and
gives a canonical value (what two hosts must agree on: "1" and "true" are the same on/off value).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from maxtext_compat.errors import CompatError, InvalidArgumentError, InvalidArgumentTypeError, ServingConfigError

CONFIG_KEY = "maxtext_compat"  # additional_config[CONFIG_KEY] = {setting key: value}
MODEL_ENV = "MAXTEXT_COMPAT_VLLM_MODEL"  # compat (default) | maxtext
MODEL_CHOICES = ("compat", "maxtext")


def model_choice(raw: str | None = None) -> str:
    """MAXTEXT_COMPAT_VLLM_MODEL (or `raw`): which MaxTextForCausalLM the plugin registers."""
    raw = os.environ.get(MODEL_ENV, "") if raw is None else raw
    value = raw.lower() or "compat"
    if value not in MODEL_CHOICES:  # " maxtext" is refused (not read as the default), like every switch
        raise InvalidArgumentError(
            f"{MODEL_ENV} selects which MaxTextForCausalLM the plugin registers",
            argument=MODEL_ENV,
            expected=f"one of {list(MODEL_CHOICES)}",
            found=repr(raw),
            fix=f"unset {MODEL_ENV} to serve maxtext-compat's model",
        )
    return value


def _flag(name: str) -> Callable[[str], object]:
    def parse(raw: str) -> object:
        from maxtext_compat.switches import parse_flag

        return parse_flag(name, raw)

    return parse


def _matrix(raw: str) -> object:
    return raw  # a path; load_matrix refuses one that is no matrix


def _rpa_kernel(raw: str) -> object:
    from maxtext_compat.platforms import kernel_choice

    return kernel_choice(raw)


def _disabled_cpu_parts(raw: str) -> object:
    from maxtext_compat.platforms import disabled_parts

    return sorted(disabled_parts(raw))


def _cpu_hbm(raw: str) -> object:
    from maxtext_compat.platforms import cpu_hbm_bytes

    return cpu_hbm_bytes(raw)


def _convention(raw: str) -> object:
    from maxtext_compat.convention.callers import ENV, check

    return check(raw, ENV)


def _deprecation(raw: str) -> object:
    from maxtext_compat.convention.policy import check_policy

    return check_policy(raw)


@dataclass(frozen=True)
class Setting:
    """One setting: its key in additional_config['maxtext_compat'], its variable, what it does, its parser."""

    key: str
    env: str
    meaning: str
    parse: Callable[[str], object]  # a non-empty raw value -> its canonical value, or a typed error naming `env`


SETTINGS: tuple[Setting, ...] = (
    Setting("vllm_model", MODEL_ENV, "which MaxTextForCausalLM the plugin registers: compat or maxtext",
            lambda raw: model_choice(raw)),
    Setting("matrix", "MAXTEXT_COMPAT_MATRIX", "the compat_matrix.yaml the installed versions resolve against",
            _matrix),
    Setting("rpa_kernel", "MAXTEXT_COMPAT_RPA_KERNEL", "the RPA kernel a CPU server runs: xla or pallas",
            _rpa_kernel),
    Setting("disable_cpu_shim", "MAXTEXT_COMPAT_DISABLE_CPU_SHIM",
            "parts of the CPU serving shim left out: 1/all, 0, or a comma list", _disabled_cpu_parts),
    Setting("cpu_hbm_gb", "MAXTEXT_COMPAT_CPU_HBM_GB", "the HBM a CPU device reports, GiB", _cpu_hbm),
    Setting("disable_request_shim", "MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM",
            "leave the serving-requests shim (the stack's request defects) out", _flag(
                "MAXTEXT_COMPAT_DISABLE_REQUEST_SHIM")),
    Setting("convention", "MAXTEXT_COMPAT_CONVENTION", "the caller convention outside any wrap()", _convention),
    Setting("deprecation", "MAXTEXT_COMPAT_DEPRECATION", "the deprecation policy of old calls: ignore, warn, error",
            _deprecation),
    Setting("strict", "MAXTEXT_COMPAT_STRICT", "strict mode: a new call's layer must return its KV cache",
            _flag("MAXTEXT_COMPAT_STRICT")),
    Setting("force_shims", "MAXTEXT_COMPAT_FORCE_SHIMS",
            "install the plugin's shims on a release outside their verified range (else ShimRefusedError)",
            _flag("MAXTEXT_COMPAT_FORCE_SHIMS")),
    Setting("traced_kv_checks", "MAXTEXT_COMPAT_TRACED_KV_CHECKS",
            "the host-callback check of a jitted KV write (unset: on on CPU, off on an accelerator)",
            _flag("MAXTEXT_COMPAT_TRACED_KV_CHECKS")),
)  # fmt: skip
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
ENV_NAMES: tuple[str, ...] = tuple(s.env for s in SETTINGS)


def config_argument(key: str) -> str:
    return f"additional_config[{CONFIG_KEY!r}][{key!r}]"


def effective(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Each setting's canonical value in `environ` (default os.environ); None = unset (the default applies)."""
    env = os.environ if environ is None else environ
    return {s.key: s.parse(raw) if (raw := env.get(s.env, "")) else None for s in SETTINGS}


def _as_env_value(key: str, value: object) -> str:
    """A JSON value of additional_config as the variable's text: true/false -> 1/0, a list -> a comma list."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise InvalidArgumentTypeError(
        f"{config_argument(key)} is not a value {BY_KEY[key].env} can take",
        argument=config_argument(key),
        expected="a non-empty string, a number, true/false, or a list of strings",
        found=repr(value),
        fix=f'give it as the variable takes it, e.g. "{key}": "..." ({BY_KEY[key].meaning})',
    )


def from_config(additional_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The settings `additional_config[maxtext_compat]` gives, as {variable: text}; checked key by key."""
    section = None if not additional_config else additional_config.get(CONFIG_KEY)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise InvalidArgumentTypeError(
            f"additional_config[{CONFIG_KEY!r}] must be a JSON object of maxtext-compat settings",
            argument=f"additional_config[{CONFIG_KEY!r}]",
            expected=f"an object with keys from {sorted(BY_KEY)}",
            found=repr(section),
            fix=f'--additional-config \'{{"{CONFIG_KEY}": {{"rpa_kernel": "xla"}}}}\'',
        )
    out: dict[str, str] = {}
    for key, value in section.items():
        setting = BY_KEY.get(key)
        if setting is None:
            raise InvalidArgumentError(
                f"{config_argument(key)} is no maxtext-compat setting",
                argument=config_argument(key),
                expected=f"one of {sorted(BY_KEY)}",
                found=repr(key),
                fix="use a key listed in docs/serving.md (each is a MAXTEXT_COMPAT_* variable without the prefix)",
            )
        if value is None:
            continue
        text = _as_env_value(key, value)
        try:
            setting.parse(text)
        except CompatError as exc:  # the reader's error, renamed to the place it was given
            raise InvalidArgumentError(
                f"{config_argument(key)} is not a value of {setting.env} ({setting.meaning})",
                argument=config_argument(key),
                expected=exc.expected,
                found=repr(value),
                fix=exc.fix,
            ) from exc
        out[setting.env] = text
    return out


def apply(
    additional_config: Mapping[str, Any] | None, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Make the config's settings this process's environment; returns {variable: text} applied.

    A variable already set here to another value (after parsing: "1" and true agree) is a ServingConfigError:
    the hosts of one program would otherwise not know which of the two is in force."""
    env = os.environ if environ is None else environ
    given = from_config(additional_config)
    by_env = {s.env: s for s in SETTINGS}
    for name, text in given.items():
        setting = by_env[name]
        raw = env.get(name, "")
        if raw and setting.parse(raw) != setting.parse(text):
            raise ServingConfigError(
                f"{config_argument(setting.key)} and ${name} disagree",
                argument=config_argument(setting.key),
                expected=f"the same value in both places, or only one of them set ({setting.meaning})",
                found=f"{config_argument(setting.key)}={text!r}, {name}={raw!r}",
                fix=f"unset {name} (the config reaches every host) or make the two equal",
            )
    for name, text in given.items():
        env[name] = text
    return given
