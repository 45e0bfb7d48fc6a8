"""`maxtext-compat --help` and every subcommand's help end with one example, and the example parses.

Why parse it: an example that names a flag the parser no longer has would teach the wrong command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex

import pytest

from maxtext_compat import cli
from maxtext_compat.serve import command as serve_cli

pytestmark = pytest.mark.envs("unit")

PARSER = cli.build_parser()
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _example(help_text: str) -> str:
    _, sep, example = help_text.rpartition("example:\n")
    assert sep, f"no example at the end of:\n{help_text}"
    (line,) = example.strip().splitlines()
    return line.strip()


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_help_ends_with_an_example_that_parses(name):
    if name == "serve":  # its own parser: vLLM's flags pass through it
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            serve_cli.build_parser().print_help()
        line = _example(out.getvalue())
        argv = shlex.split(line)
        assert argv[:2] == ["maxtext-compat", "serve"]
        args, passthrough = serve_cli.build_parser().parse_known_args(argv[2:])
        assert args.tiny and passthrough == ["--served-model-name", "tiny", "--port", "8000"]
        return
    line = _example(SUBCOMMANDS[name].format_help())
    argv = shlex.split(line)
    assert argv[:2] == ["maxtext-compat", name], line
    args = PARSER.parse_args(argv[1:])
    assert args.command == name


def test_the_top_level_help_ends_with_an_example_that_parses():
    argv = shlex.split(_example(PARSER.format_help()))
    assert argv[0] == "maxtext-compat" and PARSER.parse_args(argv[1:]).command in SUBCOMMANDS


def test_report_without_results_is_a_typed_error_naming_the_fix(tmp_path, capsys):
    code = cli.main(["report", "--results", str(tmp_path / "none.json")])
    err = capsys.readouterr().err
    assert code == 2 and "[--results]" in err and "run `maxtext-compat matrix`" in err
