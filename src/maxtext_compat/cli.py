"""The `maxtext-compat` command line: doctor, resolve, facts, envs, matrix, pins, report, demo, convert, migrate, serve.

Why thin: every command is a view over library functions (doctor.collect, resolve,
envs.build, running.run_matrix) so what the CLI prints is what the tests assert.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maxtext_compat._version import __version__
from maxtext_compat.errors import CompatError
from maxtext_compat.runner.pinsets import FORMATS


def _cmd_doctor(args: argparse.Namespace) -> int:
    from maxtext_compat import doctor

    report = doctor.collect(strict=args.strict)
    print(json.dumps(report, indent=2) if args.json else doctor.render(report))
    return 1 if "error" in report else 0


def _cmd_resolve(args: argparse.Namespace) -> int:
    from maxtext_compat.resolution.resolver import resolve

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


def _cmd_facts(args: argparse.Namespace) -> int:
    from maxtext_compat.matrix.facts import draft, read_facts

    found = read_facts(args.source)
    print(json.dumps(found.as_dict(), indent=2) if args.json else draft.render(found))
    return 0


def _workspace(args: argparse.Namespace) -> Any:
    """The workspace a matrix command runs in: --project (default: here), its state in --cache-dir."""
    from maxtext_compat.runner import workspace

    return workspace.current(args.project, state=args.cache_dir, extras=getattr(args, "extras", "") or "")


def _environment_names(ws: Any, names: Sequence[str]) -> list[str]:
    """Environment names as given; in a user's project a release (0.2.5) names its pin set (maxtext-0.2.5)."""
    from maxtext_compat.runner import envs

    out = []
    for name in names:
        envs.check_env_name(name)  # a path or a glob is refused as such, before any lookup
        if name not in ws.matrix.environments and not ws.is_checkout:
            name = ws.matrix.pin_set(name).name  # a MatrixError naming the releases when there is none
        envs.check_env_name(name)
        ws.matrix.environment(name)
        out.append(name)
    return out


def _cmd_envs(args: argparse.Namespace) -> int:
    from maxtext_compat.runner import envs

    for name in args.names:  # before anything reads the matrix or touches the envs folder
        envs.check_env_name(name)
    ws = _workspace(args)
    names = _environment_names(ws, args.names)
    m = ws.matrix
    if args.action == "build":
        envs.build_all(names or None, matrix=m, force=args.force, ws=ws)
        return 0
    if args.action == "python":
        if len(names) != 1:
            raise CompatError(
                "`envs python` takes exactly one environment name",
                argument="names",
                found=args.names,
                fix="e.g. `maxtext-compat envs python maxtext-0.2.5`",
            )
        print(envs.env_python(names[0], ws))
        return 0
    # `envs list NAME ...`: those environments only; an unknown name is a MatrixError naming the known ones
    specs = [m.environment(name) for name in names] if names else list(m.environments.values())
    rows = []
    for spec in specs:
        st = envs.status(spec, ws)
        rows.append({"name": spec.name, "maxtext": spec.maxtext, "built": st.built, "up_to_date": st.up_to_date,
                     "path": st.path, "serving": spec.serving, "description": spec.description})  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        state = (
            "built, up to date" if r["up_to_date"] else ("built, STALE (spec changed)" if r["built"] else "not built")
        )
        print(f"{r['name']:<22} maxtext {r['maxtext'] or '-':<6} {state:<28} {r['path']}")
    return 0


def _shard(text: str) -> tuple[int, int]:
    """`K/N` -> (K, N); the range is checked by running.shard (one message for every caller)."""
    part, sep, parts = text.partition("/")
    try:
        if not sep:
            raise ValueError(text)
        return int(part), int(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N (e.g. 1/2), found {text!r}") from None


def _cmd_matrix(args: argparse.Namespace) -> int:
    from maxtext_compat.report import results as report
    from maxtext_compat.runner import running

    ws = _workspace(args)
    selected = _environment_names(ws, args.names) or running.plain_run(ws.matrix, lambda m: print(m, file=sys.stderr))
    if args.maxtext is not None:  # the user's own MaxText in place of the set's
        from maxtext_compat.runner import workspace

        ws, selected = workspace.with_own_maxtext(ws, selected, args.maxtext)
    names = selected
    run: dict[str, object] = {"selected": selected}
    if args.shard is not None:
        part, parts = args.shard
        names = running.shard(selected, part, parts, running.shard_durations(ws))
        run["shard"] = f"{part}/{parts}"
    if args.list:
        print(_job_list(ws, selected, names, args) if args.json else _job_table(ws, names))
        return 0
    if not names:  # said, not a silent pass: this shard has nothing to run
        print(f"matrix: shard {run.get('shard')} of {len(selected)} environment(s) has none to run")
    results = running.run_matrix(
        names, pytest_args=args.pytest_args, build=not args.no_build, jobs=args.jobs, report_dir=args.report_dir,
        ws=ws, run=run,
    )  # fmt: skip
    out = args.report_dir or ws.state
    print()
    print(report.render_table(results))
    print(f"report: {out}/compat-report.html (open it in a browser), {out}/compat-report.md, {out}/compat-report.json")
    if args.record_durations:
        print(f"durations recorded in {running.record_durations(results, ws.durations_file)}")
    print(report.closing_line(results))
    return report.main_exit_code(results) if names else 0


def _job_list(ws: Any, selected: list[str], names: list[str], args: argparse.Namespace) -> str:
    """One JSON line, a job per environment, for a CI system's matrix (GitHub Actions' fromJSON, GitLab's
    parallel:matrix): each job's `shard` (K/N, one environment each) runs it with `matrix SELECTION --shard K/N`, so
    every job records the same selection and `report --merge` can join them and name any job that is missing."""
    from maxtext_compat.runner import running

    if args.shard is not None:
        jobs = [{"name": n, "shard": f"{args.shard[0]}/{args.shard[1]}"} for n in names]
    else:
        durations = running.shard_durations(ws)
        parts = len(selected)
        owner = {n: k for k in range(1, parts + 1) for n in running.shard(selected, k, parts, durations)}
        jobs = [{"name": n, "shard": f"{owner[n]}/{parts}"} for n in selected]
    for job in jobs:
        spec = ws.matrix.environment(job["name"])
        job.update(maxtext=spec.maxtext, python=spec.python)
    return json.dumps(jobs)


def _job_table(ws: Any, names: list[str]) -> str:
    rows = [(n, ws.matrix.environment(n)) for n in names]
    return "\n".join(f"{n:<28} maxtext {spec.maxtext or '-':<6} python {spec.python}" for n, spec in rows)


def _cmd_pins(args: argparse.Namespace) -> int:
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.runner import pinsets

    m = load_matrix()
    if args.list or args.release is None:
        if args.format == "json":
            print(json.dumps([pinsets.describe(p, m) for p in m.pin_sets.values()], indent=2))
        else:
            for p in m.pin_sets.values():
                print(f"{p.name:<24} maxtext {p.maxtext or '-':<6} python {p.python}  {p.description}")
        return 0
    print(pinsets.render(m.pin_set(args.release), m, args.format, args.folder))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from maxtext_compat.report import page
    from maxtext_compat.runner import workspace

    m = workspace.matrix_here(args.project)
    if args.merge:
        from maxtext_compat.report import merge

        out = args.out or args.cache_dir or Path(workspace.STATE_DIR_NAME)
        results = merge.merge(args.merge, out, m, screenshot=not args.no_screenshot)
        print(f"report: {out}/compat-report.html, {out}/compat-report.md, {out}/compat-report.json "
              f"({len(results)} environments from {len(args.merge)} folders)")  # fmt: skip
        return 0
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
    print(f"report: {page.write(data, m, out, screenshot=not args.no_screenshot)}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.all or args.jobs is not None or args.record_durations:  # the demo in every environment
        from maxtext_compat.demo import every_env
        from maxtext_compat.runner import workspace

        every_env.check_options(every=args.all, verbose=args.verbose, jobs=args.jobs, record=args.record_durations)
        return every_env.main(workspace.default(), steps=args.steps, real=not args.no_real_model, jobs=args.jobs,
                             as_json=args.json, record=args.record_durations)  # fmt: skip
    from maxtext_compat import demo

    return demo.run(as_json=args.json, steps=args.steps, quiet=not args.verbose, real=not args.no_real_model)


def _cmd_convert(args: argparse.Namespace) -> int:
    from maxtext_compat.convert.command import run

    return run(args)


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
    "facts": "maxtext-compat facts maxtext-0.2.5-py3-none-any.whl",
    "envs": "maxtext-compat envs build maxtext-0.2.5",
    "matrix": "maxtext-compat matrix 0.1.0 0.2.5 --extras test",
    "pins": "maxtext-compat pins 0.2.5 --format requirements",
    "report": "maxtext-compat report --results build/compat-report.json --out build",
    "demo": "maxtext-compat demo --steps 4 --no-real-model",
    "convert": "maxtext-compat convert SmolLM2-135M-Instruct.Q4_1.gguf smollm2/",
    "migrate": "maxtext-compat migrate mymodel/ --check --diff",
}


def _example(name: str) -> dict[str, Any]:
    """The parser keywords that end a command's help with its example."""
    return {"epilog": f"example:\n  {EXAMPLES[name]}", "formatter_class": argparse.RawDescriptionHelpFormatter}


def _workspace_options(p: argparse.ArgumentParser, *, extras: bool) -> None:
    p.add_argument(
        "--project",
        type=Path,
        default=None,
        help="the project whose tests run (default: the current folder; a pyproject.toml project)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where environments, results and logs go (default: PROJECT/.maxtext-compat; build/ here)",
    )
    if extras:
        p.add_argument("--extras", default="", help="your project's extras to install with it (e.g. test)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maxtext-compat", description=__doc__.splitlines()[0], **_example("maxtext-compat")
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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

    fc = sub.add_parser("facts", help="a MaxText release's facts read from its code (a wheel, a source tree, the "
                        "installed one): a draft compat_matrix.yaml row and pin set", **_example("facts"))  # fmt: skip
    fc.add_argument("source", nargs="?", default="installed", help="a .whl, a source folder, or installed (default)")
    fc.add_argument("--json", action="store_true", help="the facts, signatures and pins as JSON")
    fc.set_defaults(func=_cmd_facts)

    e = sub.add_parser("envs", help="the matrix's environments: list, build, python", **_example("envs"))
    e.add_argument("action", nargs="?", default="list", choices=["list", "build", "python"])
    e.add_argument("names", nargs="*")
    e.add_argument("--force", action="store_true")
    e.add_argument("--json", action="store_true")
    _workspace_options(e, extras=True)
    e.set_defaults(func=_cmd_envs)

    mx = sub.add_parser(
        "matrix",
        help="run a project's tests (default: the one here) in one environment per MaxText release, write the report",
        **_example("matrix"),
    )
    mx.add_argument("names", nargs="*", help="environments, or in your project MaxText releases (0.1.0 0.2.5)")
    _workspace_options(mx, extras=True)
    mx.add_argument("--maxtext", metavar="SOURCE", default=None, help="your own MaxText in place of the release's: "
                    "a source folder (installed editable), a wheel, or git+file:///PATH@REF")  # fmt: skip
    mx.add_argument(
        "--shard",
        type=_shard,
        default=None,
        metavar="K/N",
        help="run the K-th of N shards of the selection (one per machine; `report --merge` joins them)",
    )
    mx.add_argument("--list", action="store_true", help="print the environments this run (or shard) would run")
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
    mx.add_argument("--json", action="store_true", help="with --list: one JSON line (a CI system's job matrix)")
    mx.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[])
    mx.set_defaults(func=_cmd_matrix)

    pn = sub.add_parser(
        "pins", help="the tested install of a MaxText release, for any runner (uv, pip, nox, tox, CI)",
        **_example("pins"),
    )  # fmt: skip
    pn.add_argument("release", nargs="?", help="a MaxText release (0.2.5) or a pin set's name; none: list the sets")
    pn.add_argument("--format", choices=FORMATS, default="commands",
                    help="commands: a shell script that builds it with uv (default); json: every field; "
                    "requirements / no-deps / overrides: that part as a requirements file")  # fmt: skip
    pn.add_argument("--folder", type=Path, default=None, help="with --format commands: where the script's files go")
    pn.add_argument("--list", action="store_true", help="list the pin sets")
    pn.set_defaults(func=_cmd_pins)

    rp = sub.add_parser(
        "report", help="write the report page (HTML + screenshot) again from a results file", **_example("report")
    )
    rp.add_argument("--results", type=Path, default=Path("build/compat-report.json"), help="what `matrix` wrote")
    rp.add_argument("--out", type=Path, default=None, help="the folder for compat-report.html (default: beside it)")
    rp.add_argument("--no-screenshot", action="store_true", help="leave out compat-report.png (needs Chromium)")
    rp.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="join the results folders of many machines (one per shard) into one report in --out",
    )
    _workspace_options(rp, extras=False)
    rp.set_defaults(func=_cmd_report)

    dm = sub.add_parser(
        "demo", help="the library in one screen on the installed MaxText (tiny random-weight model)", **_example("demo")
    )
    dm.add_argument("--json", action="store_true")
    dm.add_argument("--steps", type=int, default=16, help="greedy decode steps (default 16)")
    dm.add_argument("--verbose", action="store_true", help="third-party messages on the console, not in a log file")
    dm.add_argument("--no-real-model", action="store_true", help="leave out the real model (SmolLM2) section")
    dm.add_argument("--all", action="store_true", help="in every MaxText environment of the matrix (make demo), "
                    "each built if needed, at once as cores and memory allow; then what each proved")  # fmt: skip
    dm.add_argument("--jobs", type=_positive_int, default=None,
                    help="with --all: environments at once (default: the cores; memory permitting)")  # fmt: skip
    dm.add_argument("--record-durations", action="store_true",
                    help="with --all: save each passing one's seconds and peak memory")  # fmt: skip
    dm.set_defaults(func=_cmd_demo)

    cv = sub.add_parser(
        "convert",
        help="a Llama-family or Gemma 3 GGUF file, or a Hugging Face directory -> a MaxText checkpoint + vLLM model "
        "directory",
        **_example("convert"),
    )
    cv.add_argument("source", help="a .gguf file or a directory with config.json and *.safetensors")
    cv.add_argument("out", help="the model directory to write (all or nothing)")
    cv.add_argument("--scan-layers", action="store_true", help="write a scanned checkpoint (MaxText training/decode)")
    cv.add_argument("--no-checkpoint", action="store_true", help="only the vLLM files (no MaxText needed)")
    cv.add_argument("--weight-dtype", default="float32", choices=["float32", "bfloat16"])
    cv.add_argument("--force", action="store_true", help="replace an earlier conversion at OUT")
    cv.add_argument("--chat-template", metavar="FILE", default=None,
                    help="a chat template (Jinja, or JSON with a chat_template key) written in place of the "
                         "source's own; without it: the source's, else its family's as MaxText ships it (Gemma 3), "
                         "else none")  # fmt: skip
    cv.add_argument("--from-maxtext", action="store_true",
                    help="SOURCE is a checkpoint MaxText's trainer saved (RUN/checkpoints, a step's folder or its "
                         "items): its parameters are checked against the --set overrides, unscanned and written "
                         "for serving")  # fmt: skip
    cv.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="with --from-maxtext: a MaxText config override the model was trained with (repeat it)",
    )
    cv.add_argument(
        "--tokenizer",
        metavar="PATH",
        default=None,
        help="with --from-maxtext: the tokenizer file or folder to serve with (without it: token ids)",
    )
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
        from maxtext_compat.serve import command as serve_cli

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
