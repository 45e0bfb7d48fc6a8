"""Pages generated from the code and the matrix: the README's versions table, the recipes, the CLI, the benchmarks.

Why generated: a table copied by hand drifts from what it copies. Each function here returns Markdown built from
the source the code itself reads (compat_matrix.yaml, the argparse parser, the README's recipe blocks, the
benchmark driver's output); `tools/mkdocs_hooks.py` puts them into the site at build time (`make docs`), and
the README's versions block is rewritten by this script and checked by tests/unit/test_readme.py:

    python tools/docs_pages.py            # rewrite the README's versions block
    python tools/docs_pages.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

from maxtext_compat.matrix import CompatMatrix, load_matrix, with_environments
from maxtext_compat.report.results import pinned_version

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
VERSIONS_START = "<!-- versions:start (generated from compat_matrix.yaml by tools/docs_pages.py; do not edit) -->"
VERSIONS_END = "<!-- versions:end -->"
RECIPES_START, RECIPES_END = "## Three recipes", "## Supported versions"


# ---------------------------------------------------------------------------------------------- versions


def ci_matrix() -> CompatMatrix:
    """This checkout's compat_matrix.yaml with its CI environments (tests/environments.yaml)."""
    return with_environments(load_matrix(REPO / "compat_matrix.yaml"), REPO / "tests" / "environments.yaml")


def _natural(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _range(spec: object) -> str:
    """A specifier set as people write it, lower bound first (`>=0.12.0,<0.20.0`)."""
    return ",".join(sorted(str(spec).split(","), key=lambda s: (not s.startswith(">"), s)))


def versions_table(m: CompatMatrix) -> str:
    """One row per MaxText release, with the environments that install it; one line for the kernel ranges.

    `m` carries this repository's CI environments (`ci_matrix()`): the shipped matrix has pin sets only."""
    lines = [
        "| MaxText | on PyPI | call convention | its vLLM path needs tpu-inference "
        "| tested here on (tpu-inference, jax) |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(m.maxtext, key=lambda r: r.release, reverse=True):
        envs = [e for e in m.environments.values() if e.maxtext == row.name]
        tested = []
        for env in envs:
            tpi, jax = pinned_version(env, "tpu-inference"), pinned_version(env, "jax")
            stack = f"tpu-inference {tpi}, jax {jax}" if tpi else f"no tpu-inference, jax {jax}"
            tested.append(f"`{env.name}`: {stack}")
        needs = _range(row.requires.tpu_inference) if row.requires.tpu_inference else "-"
        if row.vllm is None:
            needs = "none: no vLLM path of its own (the backport adds one)"
        lines.append(f"| {row.name} | {row.date} | {row.convention} | {needs} | {'; '.join(tested) or 'mocked only'} |")
    kernel = sorted({v for e in m.environments.values() if (v := pinned_version(e, "tpu-inference"))}, key=_natural)
    low, high = m.tpu_inference[0].label.split(",")[0], m.tpu_inference[-1].label.split(",")[-1]
    jaxes = sorted({v for e in m.environments.values() if (v := pinned_version(e, "jax"))}, key=_natural)
    lines += [
        "",
        f"tpu-inference: {len(m.tpu_inference)} ranges of its RPA entry point ({low} to {high}); the real kernel runs "
        "here on",
        f"{', '.join(kernel)}; jax {', '.join(jaxes)}.",
        "Every combination, coloured by what was proven there: `build/compat-report.html`, written by `make test`.",
    ]
    return "\n".join(lines) + "\n"


def readme_with_versions(readme: str, table: str) -> str:
    """README.md with `table` between the versions markers."""
    head, sep, rest = readme.partition(VERSIONS_START)
    _, sep2, tail = rest.partition(VERSIONS_END)
    if not sep or not sep2:
        raise SystemExit(f"README.md has no {VERSIONS_START} ... {VERSIONS_END} block")
    return f"{head}{VERSIONS_START}\n{table}{VERSIONS_END}{tail}"


# ---------------------------------------------------------------------------------------------- recipes


def recipes_page(readme: str) -> str:
    """The README's three recipes as a site page (its links made relative to docs/)."""
    section = readme[readme.index(RECIPES_START) : readme.index(RECIPES_END)]
    body = section.split("\n", 1)[1]
    body = re.sub(r"\]\(docs/", "](", body)
    body = body.replace("](benchmarks/README.md)", "](benchmarks.md)")
    return (
        "# Three recipes\n\n"
        "<!-- generated from README.md's recipes by tools/docs_pages.py; edit them there -->\n\n"
        "The three situations maxtext-compat exists for. Each block below is run by "
        "`tests/compat/test_readme_recipes.py`, so it works as written.\n" + body.replace("\n### ", "\n## ")
    )


# ---------------------------------------------------------------------------------------------- CLI


def cli_page() -> str:
    """Every subcommand's --help, from the parser the CLI runs (80 columns, as a terminal shows it)."""
    from maxtext_compat import cli
    from maxtext_compat.serve import command as serve_cli

    os.environ["COLUMNS"] = "100"
    parser = cli.build_parser()
    lines = [
        "# Command line: `maxtext-compat`",
        "",
        "<!-- generated from maxtext_compat.cli.build_parser() by tools/docs_pages.py -->",
        "",
        "Each section is the command's own `--help`, as this version prints it.",
        "",
        "```",
        parser.format_help().rstrip(),
        "```",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, child in sub.choices.items():
        lines += ["", f"## `maxtext-compat {name}`", ""]
        if name == "serve":  # its own parser: vLLM's flags pass through unparsed
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                serve_cli.build_parser().print_help()
            text = out.getvalue()
        else:
            text = child.format_help()
        lines += ["```", text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- benchmarks


def benchmarks_page(build: Path) -> str:
    """benchmarks/README.md, then the latest `make bench` results and plots when build/bench.json exists."""
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    text = text.replace("# Benchmarks", "# Benchmarks\n\n<!-- benchmarks/README.md, then build/bench.md -->", 1)
    bench_md, bench_json = build / "bench.md", build / "bench.json"
    if not bench_json.is_file():
        return text + "\n## Results\n\nNo `make bench` results in this build (`build/bench.json` is absent).\n"
    from maxtext_compat.report import plots

    figures = plots.bench_figures(json.loads(bench_json.read_text(encoding="utf-8")))
    results = bench_md.read_text(encoding="utf-8") if bench_md.is_file() else ""
    results = re.sub(r"^# .*\n", "", results, count=1).replace("\n## ", "\n### ")
    body = "\n".join(f'<figure markdown="0">{svg}<figcaption>{cap}</figcaption></figure>' for cap, svg in figures)
    return text + "\n## Results of the last `make bench`\n\n" + body + "\n\n" + results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's versions block is stale")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    wanted = readme_with_versions(current, versions_table(ci_matrix()))
    if args.check:
        print(f"README.md's versions table is {'current' if wanted == current else 'stale'}")
        return 0 if wanted == current else 1
    README.write_text(wanted, encoding="utf-8")
    print("wrote README.md's versions table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
