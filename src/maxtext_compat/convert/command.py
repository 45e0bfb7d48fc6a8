"""`maxtext-compat convert`: the command's handler (flags checked, the conversion run, its result printed).

Why here and not in cli.py: the command has two modes (a GGUF file or Hugging Face directory; MaxText's own
training checkpoint with --from-maxtext) whose flags must not be silently ignored in the other mode.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
from typing import Any

from maxtext_compat.errors import InvalidArgumentError


def run(args: argparse.Namespace) -> int:
    """Run the parsed `convert` command; 0 on success (typed errors propagate to the CLI)."""
    from maxtext_compat.convert import convert

    if not args.from_maxtext:
        _refuse_flags(
            {"--set": args.set, "--tokenizer": args.tokenizer},
            expected="only with --from-maxtext",
            fix="leave {flag} out, or convert MaxText's own training checkpoint with --from-maxtext",
        )
    # MaxText's config code prints to stdout: the command's own output (its --json) stays the only thing there
    with contextlib.redirect_stdout(sys.stderr):
        if args.from_maxtext:
            result = _convert_trained(args)
        else:
            result = convert(
                args.source, args.out, checkpoint=not args.no_checkpoint, scan_layers=args.scan_layers,
                weight_dtype=args.weight_dtype, force=args.force, chat_template=args.chat_template,
            )  # fmt: skip
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True))
        return 0
    print(f"wrote {result.out}: {', '.join(result.files)}")
    print(result.chat_template_note)
    if result.checkpoint:
        print(f"MaxText checkpoint (load_parameters_path): {result.checkpoint}")
    if not args.scan_layers:
        print(f"serve it:  maxtext-compat serve {shlex.quote(result.out)} --max-model-len 32 --max-num-seqs 1")
    return 0


def _refuse_flags(given: dict[str, Any], *, expected: str, fix: str) -> None:
    """A flag that would be silently ignored in this mode is refused instead."""
    for flag, value in given.items():
        if value:
            raise InvalidArgumentError(f"{flag} does not apply here", argument=flag, expected=expected,
                                       found=repr(value), fix=fix.format(flag=flag))  # fmt: skip


def _convert_trained(args: argparse.Namespace) -> Any:
    from maxtext_compat.convert.from_maxtext import convert_trained, parse_overrides

    _refuse_flags(
        {"--scan-layers": args.scan_layers, "--no-checkpoint": args.no_checkpoint,
         "--chat-template": args.chat_template},
        expected="with --from-maxtext: --set KEY=VALUE (the training overrides), --tokenizer, --weight-dtype, --force",
        fix="leave {flag} out: a trained checkpoint is always written unscanned, with its tokenizer's template",
    )  # fmt: skip
    return convert_trained(args.source, args.out, parse_overrides(args.set or []), tokenizer=args.tokenizer,
                           weight_dtype=args.weight_dtype, force=args.force)  # fmt: skip
