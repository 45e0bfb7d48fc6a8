"""`maxtext-compat serve`: `vllm serve` with the environment and flags a MaxText model needs.

Why a wrapper: serving MaxText through tpu-inference needs settings users forget
(NEW_MODEL_DESIGN=1 for the mesh MaxText's config shards on; on a CPU host the TPU_* variables
that stop metadata polling, SKIP_JAX_PRECOMPILE, virtual devices for TP), and a tiny model needs a
model directory with config.json. Every vLLM flag is passed through unchanged, so the usual
MaxText-on-vLLM command works as is (`maxtext-compat serve <model> --additional-config '{"maxtext_config":...}'`);
ours are only `--tiny`, `--dry-run` and `--vllm-bin`, and our defaults never override a flag or
variable the user set.

A model directory written by `maxtext-compat convert` holds maxtext_config.json: its keys (the
model's shape and load_parameters_path) fill maxtext_config, any key given on the command line wins.

`--tiny` fills maxtext_config with the tiny test model's sizes (any key given wins), writes
config.json into the model directory (a temporary one when none is given, removed once the server has exited;
`--dry-run` keeps it for the printed command) and adds small-cache flags
(`--max-model-len`, `--block-size 16`, `--num-gpu-blocks-override`, `--dtype`, `--skip-tokenizer-init`,
`--load-format dummy` without a checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxtext_compat import tempdirs
from maxtext_compat.errors import InvalidArgumentError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
# The tiny model's MaxText keys that shape it (testing.tiny.TINY minus test-only switches).
TINY_MODEL_KEYS = (
    "base_emb_dim",
    "base_num_query_heads",
    "base_num_kv_heads",
    "head_dim",
    "base_mlp_dim",
    "base_num_decoder_layers",
    "vocab_size",
    "max_target_length",
    "max_prefill_predict_length",
    "dtype",
    "weight_dtype",
    "matmul_precision",
)
CPU_ENV = {"TPU_NAME": "cpu-test", "TPU_WORKER_ID": "0", "TPU_ACCELERATOR_TYPE": "cpu", "SKIP_JAX_PRECOMPILE": "1"}
TINY_VLLM_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--max-num-seqs", "2"),
    ("--max-num-batched-tokens", "64"),
    ("--block-size", "16"),
    ("--num-gpu-blocks-override", "16"),
)
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


@dataclass
class ServeCommand:
    """What `serve` runs: the command line, the environment changes, and notes for the user."""

    argv: list[str]
    env_changes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    model_dir: str | None = None
    # `--tiny` without a directory: the temporary one made for this command (tempdirs), removed when this process
    # exits, or, after `run` execs the server, once the server has exited.
    temporary_model_dir: str | None = None

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_changes.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maxtext-compat serve",
        usage="maxtext-compat serve [MODEL] [--tiny] [--dry-run] [--vllm-bin PATH] [vllm serve flags ...]",
        description="vllm serve for MaxText models; MODEL and every vLLM flag are passed through unchanged.",
        epilog="example:\n  maxtext-compat serve --tiny --served-model-name tiny --port 8000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tiny", action="store_true", help="serve the tiny test model: write config.json, small cache")
    p.add_argument("--dry-run", action="store_true", help="print the environment and command, do not run")
    p.add_argument("--vllm-bin", default=None, help="the vllm executable (default: next to this Python)")


def _flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag in `args` (`--f v` or `--f=v`), else None.

    A flag given last, without its value, is an error (vLLM would fail on it after start-up)."""
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                value = args[i + 1]
            elif a == n:
                raise InvalidArgumentError(
                    f"{n} is given without a value",
                    argument=n,
                    expected=f"{n} VALUE",
                    found=f"{n} as the last argument",
                    fix=f"pass a value after {n}, or drop the flag",
                )
            elif a.startswith(n + "="):
                value = a.split("=", 1)[1]
    return value


def _has_flag(args: Sequence[str], *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in args)


def _set_flag(args: list[str], name: str, value: str) -> None:
    """Replace every occurrence of `name` (both forms) by one `name value`."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == name and i + 1 < len(args):
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        out.append(a)
    args[:] = [*out, name, value]


def _additional_config(args: Sequence[str]) -> dict[str, Any]:
    from maxtext_compat.serving.serve_inputs import parse_additional_config

    raw = _flag_value(args, "--additional-config")
    return {} if raw is None else parse_additional_config(raw)


def _tp(args: Sequence[str], maxtext: Mapping[str, Any]) -> tuple[int, bool]:
    """(tensor-parallel degree, whether it came from the vLLM flags)."""
    from maxtext_compat.serving.serve_inputs import int_setting, positive_int

    for flag in ("--tensor-parallel-size", "-tp"):
        raw = _flag_value(args, flag)
        if raw is not None:
            return positive_int(flag, raw), True
    if "ici_tensor_parallelism" not in maxtext:
        return 1, False
    if maxtext["ici_tensor_parallelism"] == -1:  # MaxText: fill with the devices left
        return 1, False
    return int_setting(maxtext, "ici_tensor_parallelism"), False


def _tiny_maxtext(maxtext: Mapping[str, Any], tp: int) -> dict[str, Any]:
    from maxtext_compat.serving.model_dir import KEY_MAP
    from maxtext_compat.serving.serve_inputs import int_setting
    from maxtext_compat.testing.tiny import TINY

    out = {"model_name": "default", **{k: TINY[k] for k in TINY_MODEL_KEYS}}
    for key in KEY_MAP:  # the sizes config.json is written from: whole numbers, not 1.5 or "8"
        if key in maxtext:
            int_setting(maxtext, key)
    out["base_num_query_heads"] = max(int(out["base_num_query_heads"]), tp)
    out.update(maxtext)
    return out


def _vllm_bin(explicit: str | None) -> str:
    if explicit:
        return explicit
    beside = Path(sys.executable).with_name("vllm")
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm")
    if found is None:
        raise InvalidArgumentError(
            "the vllm executable was not found",
            argument="--vllm-bin",
            expected="vllm-tpu installed in this environment",
            found=f"no vllm next to {sys.executable} or on PATH",
            fix="install vllm-tpu, or pass --vllm-bin /path/to/vllm",
        )
    return found


def build_command(
    ns: argparse.Namespace, passthrough: Sequence[str], environ: Mapping[str, str] | None = None
) -> ServeCommand:
    """The `vllm serve` command and environment for parsed options + vLLM flags (no side effects but
    writing config.json for --tiny)."""
    environ = dict(os.environ if environ is None else environ)
    _check_switches(environ)
    args = list(passthrough)
    # `vllm serve <model> [flags]`: the model is the first argument when it is not a flag.
    model = args.pop(0) if args and not args[0].startswith("-") else _flag_value(args, "--model")
    if model is not None and not model.strip():
        raise InvalidArgumentError(
            "the model path is empty",
            argument="model",
            expected="a model directory whose config.json names MaxTextForCausalLM, or --tiny",
            found=repr(model),
            fix="maxtext-compat serve /path/to/model ...",
        )
    additional = _additional_config(args)
    maxtext = dict(additional.get("maxtext_config") or {})
    tp, tp_from_flag = _tp(args, maxtext)
    notes: list[str] = []
    temporary: str | None = None
    env: dict[str, str] = {}

    if ns.tiny:
        maxtext = _tiny_maxtext(maxtext, tp)
        additional["maxtext_config"] = maxtext
        _set_flag(args, "--additional-config", json.dumps(additional, sort_keys=True))
        if model is None:
            model = temporary = tempdirs.make("maxtext_compat_tiny_model_")
        _write_tiny_dir(model, maxtext)
        notes.append(f"wrote {model}/config.json for the tiny model")
        defaults: list[tuple[str, str | None]] = [
            *TINY_VLLM_DEFAULTS,
            ("--max-model-len", str(maxtext["max_target_length"])),
            ("--dtype", str(maxtext["dtype"])),
        ]
        if not maxtext.get("load_parameters_path"):
            defaults.append(("--load-format", "dummy"))
        for flag, value in defaults:
            if not _has_flag(args, flag):
                args += [flag] if value is None else [flag, value]
    if model is None:
        raise InvalidArgumentError(
            "no model given",
            argument="model",
            expected="a model directory whose config.json names MaxTextForCausalLM, or --tiny",
            found=None,
            fix="maxtext-compat serve /path/to/model --additional-config '{\"maxtext_config\": {...}}'",
        )
    tokenizer_given = _has_flag(args, "--tokenizer") or _has_flag(args, "--skip-tokenizer-init")
    if not tokenizer_given and not any((Path(model) / f).exists() for f in TOKENIZER_FILES):
        # no tokenizer to load (the tiny model; a trained checkpoint converted without --tokenizer): token ids in/out
        args.append("--skip-tokenizer-init")
        notes.append(f"{model} has no tokenizer: --skip-tokenizer-init (prompts and completions as token ids)")
    if not ns.tiny:
        from maxtext_compat.serving.model_dir import MAXTEXT_CONFIG
        from maxtext_compat.serving.serve_inputs import check_model_dir, read_maxtext_config

        check_model_dir(model)  # before vLLM's ~40 s start-up, not as a traceback after it
        converted = read_maxtext_config(model)
        if converted is not None:  # written by `maxtext-compat convert`: the model's keys; the user's win
            given = set(maxtext)
            additional["maxtext_config"] = maxtext = {**converted, **maxtext}
            _set_flag(args, "--additional-config", json.dumps(additional, sort_keys=True))
            taken = sorted(set(converted) - given)
            notes.append(
                f"maxtext_config: {len(taken)} keys from {model}/{MAXTEXT_CONFIG} (yours win: {sorted(given)})"
            )
            if not _has_flag(args, "--dtype") and "dtype" in maxtext:  # the KV cache must match MaxText's dtype
                args += ["--dtype", str(maxtext["dtype"])]
                notes.append(f"--dtype {maxtext['dtype']} (maxtext_config.dtype; the KV cache must match it)")
    if tp > 1 and not tp_from_flag:
        args += ["--tensor-parallel-size", str(tp)]
        notes.append(f"--tensor-parallel-size {tp} from maxtext_config.ici_tensor_parallelism")
    if not _has_flag(args, "--host"):
        args += ["--host", "127.0.0.1"]
        notes.append("listening on 127.0.0.1 (pass --host to change)")

    # NEW_MODEL_DESIGN=1: tpu-inference then builds the 7-axis mesh MaxText's vllm.yml shards on.
    env.setdefault("NEW_MODEL_DESIGN", environ.get("NEW_MODEL_DESIGN", "1"))
    if environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        for k, v in CPU_ENV.items():
            if k not in environ:
                env[k] = v
        notes.append(
            "on CPU, tpu-inference's TPU probes log harmless lines ('Unable to poll the TPU GCE Metadata', 'Failed to "
            "detect number of TPUs', 'Error getting device name', os.fork() warnings): nothing to act on"
        )
        if ns.tiny and "HF_HUB_OFFLINE" not in environ:
            env["HF_HUB_OFFLINE"] = "1"
        flags = environ.get("XLA_FLAGS", "")
        if tp > 1 and DEVICE_COUNT_FLAG not in flags:
            env["XLA_FLAGS"] = f"{flags} {DEVICE_COUNT_FLAG}={tp}".strip()
            notes.append(f"{tp} virtual CPU devices for tensor parallelism")
    env = {k: v for k, v in env.items() if environ.get(k) != v}
    if _has_flag(args, "--model"):
        _set_flag(args, "--model", str(model))
        argv = [_vllm_bin(ns.vllm_bin), "serve", *args]
    else:
        argv = [_vllm_bin(ns.vllm_bin), "serve", str(model), *args]
    return ServeCommand(argv, env, notes, str(model), temporary_model_dir=temporary)


def _check_switches(environ: Mapping[str, str]) -> None:
    """The switches the vLLM processes will read, checked here so a typo stops `serve` at once."""
    from maxtext_compat import platforms
    from maxtext_compat.convention.policy import STRICT_ENV
    from maxtext_compat.serve.vllm_plugin import MODEL_ENV, model_choice, new_model_design
    from maxtext_compat.switches import parse_flag

    parse_flag(STRICT_ENV, environ.get(STRICT_ENV))
    platforms.disabled_parts(environ.get(platforms.DISABLE_ENV, ""))
    platforms.cpu_hbm_bytes(environ.get(platforms.HBM_ENV, ""))
    platforms.kernel_choice(environ.get(platforms.KERNEL_ENV, ""))
    model_choice(environ.get(MODEL_ENV, ""))
    new_model_design(environ)


def _write_tiny_dir(path: str, maxtext: Mapping[str, Any]) -> None:
    from maxtext_compat.serving.model_dir import ARCH, write_model_dir

    if Path(path).exists() and not Path(path).is_dir():
        raise InvalidArgumentError(
            "--tiny needs a directory to write config.json into",
            argument="model",
            expected="a directory (or a path that does not exist yet)",
            found=f"{path} is a file",
            fix="give --tiny a new directory (or none: a temp dir is used)",
        )
    cfg_file = Path(path) / "config.json"
    if cfg_file.exists():
        try:
            archs = json.loads(cfg_file.read_text()).get("architectures")
        except (OSError, json.JSONDecodeError):
            archs = None
        if archs != [ARCH]:
            raise InvalidArgumentError(
                "--tiny would overwrite a config.json of another model",
                argument="model",
                expected=f"an empty directory or one whose config.json names {ARCH}",
                found=f"{cfg_file} with architectures {archs}",
                fix="give --tiny a new directory (or none: a temp dir is used)",
            )
    write_model_dir(path, maxtext)


def run(ns: argparse.Namespace, passthrough: Sequence[str]) -> int:
    cmd = build_command(ns, passthrough)
    for note in cmd.notes:
        print(f"maxtext-compat serve: {note}", file=sys.stderr)
    if ns.dry_run:
        if cmd.temporary_model_dir is not None:  # the printed command names it: it is the user's to remove
            tempdirs.release(cmd.temporary_model_dir)
            print(f"maxtext-compat serve: {cmd.temporary_model_dir} is kept for this command", file=sys.stderr)
        print(cmd.shell())
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    # The server's processes get a $TMPDIR of their own: what they leave there when killed (vLLM's IPC sockets, its
    # Prometheus folder, torch's and JAX's scratch) goes with the server instead of piling up in the user's.
    env = {**os.environ, **cmd.env_changes, "TMPDIR": tempdirs.make("maxtext_compat_serve_")}
    owned = [env["TMPDIR"]] + ([cmd.temporary_model_dir] if cmd.temporary_model_dir is not None else [])
    for path in owned:
        tempdirs.hand_to_exec(path)  # removed once the server and every process it forked have exited
    os.execve(cmd.argv[0], cmd.argv, env)
    return 0  # pragma: no cover - execve does not return


def main(argv: Sequence[str] | None = None) -> int:
    from maxtext_compat.errors import CompatError

    ns, passthrough = build_parser().parse_known_args(argv)
    try:
        return run(ns, passthrough)
    except CompatError as exc:
        print(f"maxtext-compat serve: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
