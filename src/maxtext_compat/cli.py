"""The `maxtext-compat` command line: doctor, resolve, envs, matrix, report, demo, convert, migrate, serve.

Why thin: every command is a view over library functions (doctor.collect, resolve,
envs.build, env_runner.run_matrix) so what the CLI prints is what the tests assert.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maxtext_compat.errors import CompatError


def _cmd_doctor(args: argparse.Namespace) -> int:
    from maxtext_compat import doctor

    report = doctor.collect(strict=args.strict)
    print(json.dumps(report, indent=2) if args.json else doctor.render(report))
    return 1 if "error" in report else 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    from maxtext_compat.resolver import resolve

    versions = {
        k: v
        for k, v in (("maxtext", args.maxtext), ("tpu-inference", args.tpu_inference), ("vllm", args.vllm),
                     ("jax", args.jax))
        if v is not None  # an empty --maxtext "" is refused by resolve(), not dropped
    }  # fmt: skip
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = resolve(versions, probe=False)
    data = res.as_dict()
    data["warnings"] = [str(w.message) for w in seen]
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(
        f"maxtext {data['maxtext']} ({data['maxtext_match']}): convention {data['convention']}, "
        f"import root {data['import_root']}, default decoder {data['default_decoder']}"
    )
    form = data["rpa_call_form"]
    if form:
        print(
            f"tpu-inference {data['tpu_inference']}: RPA {form['form']} {form['module']}.{form['function']}"
            f"({', '.join(form['factory_params'] or form['params'])}) kwargs={form['kwargs']}; "
            f"model returns a {data['model_return_arity']}-tuple"
        )
    for w in data["warnings"]:
        print(f"warning: {w}")
    return 0


def _cmd_envs(args: argparse.Namespace) -> int:
    from maxtext_compat import envs
    from maxtext_compat.matrix import load_matrix

    for name in args.names:  # before anything reads the matrix or touches the envs folder
        envs.check_env_name(name)
    m = load_matrix()
    if args.action == "build":
        envs.build_all(args.names or None, matrix=m, force=args.force)
        return 0
    if args.action == "python":
        if len(args.names) != 1:
            raise CompatError(
                "`envs python` takes exactly one environment name",
                argument="names",
                found=args.names,
                fix="e.g. `maxtext-compat envs python maxtext-0.2.5`",
            )
        m.environment(args.names[0])
        print(envs.env_python(args.names[0]))
        return 0
    # `envs list NAME ...`: those environments only; an unknown name is a MatrixError naming the known ones
    specs = [m.environment(name) for name in args.names] if args.names else list(m.environments.values())
    rows = []
    for spec in specs:
        st = envs.status(spec)
        rows.append(
            {
                "name": spec.name,
                "maxtext": spec.maxtext,
                "built": st.built,
                "up_to_date": st.up_to_date,
                "path": st.path,
                "serving": spec.serving,
                "description": spec.description,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        state = (
            "built, up to date" if r["up_to_date"] else ("built, STALE (spec changed)" if r["built"] else "not built")
        )
        print(f"{r['name']:<22} maxtext {r['maxtext'] or '-':<6} {state:<28} {r['path']}")
    return 0


def _cmd_matrix(args: argparse.Namespace) -> int:
    from maxtext_compat import env_runner

    results = env_runner.run_matrix(
        args.names or None, pytest_args=args.pytest_args, build=not args.no_build, jobs=args.jobs,
        report_dir=args.report_dir,
    )  # fmt: skip
    out = args.report_dir or "build"
    print()
    print(env_runner.render_table(results))
    print(f"report: {out}/compat-report.html (open it in a browser), {out}/compat-report.md, {out}/compat-report.json")
    if args.record_durations:
        print(f"durations recorded in {env_runner.record_durations(results)}")
    print(env_runner.closing_line(results))
    return env_runner.main_exit_code(results)


def _cmd_report(args: argparse.Namespace) -> int:
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.report import page

    if not args.results.is_file():
        raise CompatError(
            "no results file to draw the report from",
            argument="--results",
            expected="the compat-report.json `maxtext-compat matrix` writes",
            found=str(args.results),
            fix="run `maxtext-compat matrix` (or `make test`) first, or pass --results PATH",
        )
    data = json.loads(args.results.read_text(encoding="utf-8"))
    out = args.out or args.results.parent
    out.mkdir(parents=True, exist_ok=True)
    print(f"report: {page.write(data, load_matrix(), out, screenshot=not args.no_screenshot)}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from maxtext_compat import demo

    return demo.run(as_json=args.json, steps=args.steps, quiet=not args.verbose, real=not args.no_real_model)


def _cmd_convert(args: argparse.Namespace) -> int:
    from maxtext_compat.convert import convert

    result = convert(args.source, args.out, checkpoint=not args.no_checkpoint, scan_layers=args.scan_layers,
                     weight_dtype=args.weight_dtype, force=args.force)  # fmt: skip
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True))
        return 0
    print(f"wrote {result.out}: {', '.join(result.files)}")
    if result.checkpoint:
        print(f"MaxText checkpoint (load_parameters_path): {result.checkpoint}")
    if not args.scan_layers:
        print(f"serve it:  maxtext-compat serve {shlex.quote(result.out)} --max-model-len 32 --max-num-seqs 1")
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:

    from maxtext_compat.migrate import files

    try:
        import libcst  # noqa: F401
    except ImportError:
        print("maxtext-compat: error: migrate needs libcst: pip install 'maxtext-compat[migrate]'", file=sys.stderr)
        return 2
    reports = files.run([Path(p) for p in args.paths], args.to, write=args.write)
    if args.json:
        print(files.as_json(reports))
    else:
        print(files.render(reports, diff=args.diff, wrote=args.write))
    return files.exit_code(reports, check=args.check)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {text!r}")
    return value


# One example per command, shown at the end of its --help (tests/unit/test_cli.py runs the parser on each).
EXAMPLES: dict[str, str] = {
    "maxtext-compat": "maxtext-compat resolve --maxtext 0.2.5 --tpu-inference 0.32.0",
    "doctor": "maxtext-compat doctor --json",
    "resolve": "maxtext-compat resolve --maxtext 0.2.2 --tpu-inference 0.20.0",
    "envs": "maxtext-compat envs build maxtext-0.2.5",
    "matrix": 'maxtext-compat matrix maxtext-0.1.0 maxtext-0.2.5 --pytest-args "$PWD/test_mine.py"',
    "report": "maxtext-compat report --results build/compat-report.json --out build",
    "demo": "maxtext-compat demo --steps 4 --no-real-model",
    "convert": "maxtext-compat convert SmolLM2-135M-Instruct.Q4_1.gguf smollm2/",
    "migrate": "maxtext-compat migrate mymodel/ --check --diff",
}


def _example(name: str) -> dict[str, Any]:
    """The parser keywords that end a command's help with its example."""
    return {"epilog": f"example:\n  {EXAMPLES[name]}", "formatter_class": argparse.RawDescriptionHelpFormatter}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maxtext-compat", description=__doc__.splitlines()[0], **_example("maxtext-compat")
    )
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="installed versions, resolved row, probes, active patches", **_example("doctor"))
    d.add_argument("--json", action="store_true")
    d.add_argument("--strict", action="store_true", help="a probe mismatch is an error")
    d.set_defaults(func=_cmd_doctor)

    r = sub.add_parser("resolve", help="the matrix's decision for a hypothetical combination", **_example("resolve"))
    r.add_argument("--maxtext", required=True)
    r.add_argument("--tpu-inference", dest="tpu_inference")
    r.add_argument("--vllm")
    r.add_argument("--jax")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_cmd_resolve)

    e = sub.add_parser("envs", help="the matrix's environments: list, build, python", **_example("envs"))
    e.add_argument("action", nargs="?", default="list", choices=["list", "build", "python"])
    e.add_argument("names", nargs="*")
    e.add_argument("--force", action="store_true")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_cmd_envs)

    mx = sub.add_parser(
        "matrix", help="run the test suite inside every environment and write the report", **_example("matrix")
    )
    mx.add_argument("names", nargs="*")
    mx.add_argument("--no-build", action="store_true")
    mx.add_argument(
        "--jobs", type=_positive_int, default=1, help="environments run at once (output to build/logs/ENV.log)"
    )
    mx.add_argument(
        "--record-durations", action="store_true", help="save each passing environment's time (longest run first)"
    )
    mx.add_argument(
        "--report-dir", type=Path, default=None, help="where the reports, junit files and logs go (default: build/)"
    )
    mx.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[])
    mx.set_defaults(func=_cmd_matrix)

    rp = sub.add_parser(
        "report", help="write the report page (HTML + screenshot) again from a results file", **_example("report")
    )
    rp.add_argument("--results", type=Path, default=Path("build/compat-report.json"), help="what `matrix` wrote")
    rp.add_argument("--out", type=Path, default=None, help="the folder for compat-report.html (default: beside it)")
    rp.add_argument("--no-screenshot", action="store_true", help="leave out compat-report.png (needs Chromium)")
    rp.set_defaults(func=_cmd_report)

    dm = sub.add_parser(
        "demo", help="the library in one screen on the installed MaxText (tiny random-weight model)", **_example("demo")
    )
    dm.add_argument("--json", action="store_true")
    dm.add_argument("--steps", type=int, default=16, help="greedy decode steps (default 16)")
    dm.add_argument("--verbose", action="store_true", help="third-party messages on the console, not in a log file")
    dm.add_argument("--no-real-model", action="store_true", help="leave out the real model (SmolLM2) section")
    dm.set_defaults(func=_cmd_demo)

    cv = sub.add_parser(
        "convert",
        help="a Llama-family GGUF file or Hugging Face directory -> a MaxText checkpoint + vLLM model directory",
        **_example("convert"),
    )
    cv.add_argument("source", help="a .gguf file or a directory with config.json and *.safetensors")
    cv.add_argument("out", help="the model directory to write (all or nothing)")
    cv.add_argument("--scan-layers", action="store_true", help="write a scanned checkpoint (MaxText training/decode)")
    cv.add_argument("--no-checkpoint", action="store_true", help="only the vLLM files (no MaxText needed)")
    cv.add_argument("--weight-dtype", default="float32", choices=["float32", "bfloat16"])
    cv.add_argument("--force", action="store_true", help="replace an earlier conversion at OUT")
    cv.add_argument("--json", action="store_true")
    cv.set_defaults(func=_cmd_convert)

    mg = sub.add_parser(
        "migrate", help="find and rewrite call sites of MaxText layers for the other convention", **_example("migrate")
    )
    mg.add_argument("paths", nargs="+", help="files or directories (*.py, recursively)")
    mg.add_argument("--to", choices=["kv_return", "legacy"], default="kv_return",
                    help="kv_return: unpack (out, kv_cache) (MaxText PR #2616); legacy: the bare results")  # fmt: skip
    mode = mg.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if any call site needs a change (for CI)")
    mode.add_argument("--write", action="store_true", help="rewrite the files in place")
    mg.add_argument("--diff", action="store_true", help="print a unified diff of the changes")
    mg.add_argument("--json", action="store_true")
    mg.set_defaults(func=_cmd_migrate)

    # `serve` hands its arguments to vLLM unparsed (see main): listed here for --help only.
    sv = sub.add_parser(
        "serve",
        add_help=False,
        help="vllm serve for MaxText models (MODEL and every vLLM flag pass through; --tiny, --dry-run)",
    )
    sv.set_defaults(func=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # argparse cannot pass unknown vLLM flags through a subparser
        from maxtext_compat import serve_cli

        return serve_cli.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe must fail here, inside the handler, not at interpreter exit
        return code
    except CompatError as exc:
        print(f"maxtext-compat: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`maxtext-compat resolve --json | head`): stop quietly, as Unix
        # tools do, and keep Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
