"""`maxtext-compat facts` as text: a draft compat_matrix.yaml row and a draft pin set, in the file's own format.

Why a draft: the code facts are read (and printed as they go into the row); the day it reached PyPI, the
tpu-inference range it was tested with, the jax it was verified on and the prose are a person's, left as TODO.
"""

from __future__ import annotations

from typing import Any

from packaging.requirements import Requirement

from maxtext_compat.matrix.facts.derive import ReleaseFacts

TODO = "TODO"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return str(value)


def _block(data: dict[str, Any], indent: int) -> list[str]:
    pad = " " * indent
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.extend(_block(value, indent + 2))
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return lines


def draft_row(facts: ReleaseFacts) -> str:
    """The row to paste under `maxtext:` (its TODOs filled by hand)."""
    row = facts.row
    version = facts.version or TODO
    commit = facts.origin.get("commit")
    vllm = row["vllm"]
    if vllm is not None and not vllm["per_layer_metadata"]:
        vllm = {k: v for k, v in vllm.items() if k != "per_layer_metadata"}  # the default, left out as in the file
    tpi = next((p for p in facts.github_pins if p["package"] == "tpu-inference"), None)
    lines = [
        f'  - release: "{version}"',
        f'    date: "{TODO}"  # the day it reached PyPI (UTC)',
        f"    source_commit: {_scalar(commit)}" + ("" if commit else f"  # {TODO}: the release's commit"),
        *_block({k: row[k] for k in ("import_root", "convention", "classes", "decoder_layers", "default_decoder",
                                     "returns", "params", "scan_kv_carry")}, 4),
    ]  # fmt: skip
    if row["scan_kv_carry_layers"]:
        lines.append(f"    scan_kv_carry_layers: {_scalar(row['scan_kv_carry_layers'])}")
    lines += ["    vllm: null"] if vllm is None else ["    vllm:", *_block(vllm, 6)]
    lines += ["    config:", *_block(row["config"], 6), "    requires:"]
    if vllm is None:
        lines.append("      tpu_inference: null")
    else:
        pinned = f"; MaxText pins tpu-inference {tpi['commit'][:9]} ({tpi['file']})" if tpi else ""
        lines.append(f'      tpu_inference: "{TODO}"  # the releases whose API this one calls{pinned}')
    lines += [
        f"    jax_verified: []  # {TODO}: the jax releases the suite passed on",
        "    deprecation:",
        "      policy: ignore",
        *([] if row["convention"] == "legacy" else ['      since: "0.2.0"']),
        f"      migration: {TODO}",
        f"    notes: {TODO}",
    ]
    return "\n".join(lines)


def draft_pin_set(facts: ReleaseFacts) -> str:
    """The pin set to paste under `pin_sets:`: the release and what it declares on the jax / vLLM stack."""
    version = facts.version or TODO
    lines = [
        f"  maxtext-{version}:",
        f"    description: {TODO}",
        '    python: "3.12"',
        f'    maxtext: "{version}"',
        f'    exclude_newer: "{TODO}"  # the registry as it stood when the set was tested',
        "    requirements:",
        f"      - maxtext=={version}",
    ]
    for req in _stack_requirements(facts.requirements):
        lines.append(f"      - {req}  # {TODO}: pin the release tested (the wheel declares this)")
    for pin in facts.github_pins:
        lines.append(f"      # {pin['package']}: MaxText pins commit {pin['commit'][:9]} ({pin['file']}); "
                     f"{TODO}: pin the release that holds it")  # fmt: skip
    lines.append("    env: *cpu_env")
    return "\n".join(lines)


def _stack_requirements(lines: list[str]) -> list[str]:
    """One requirement per package: unconditional, else the `tpu` extra's (what a TPU install gets)."""
    chosen: dict[str, str] = {}
    for line in lines:
        req = Requirement(line)
        marker = str(req.marker or "")
        rank = 0 if not marker else (1 if 'extra == "tpu"' in marker or "extra == 'tpu'" in marker else None)
        if rank is None:
            continue
        if req.name not in chosen or rank == 0:
            chosen[req.name] = f"{req.name}{req.specifier}"
    return list(chosen.values())


def render(facts: ReleaseFacts) -> str:
    """What `maxtext-compat facts` prints: where it read, then the two drafts."""
    where = f"{facts.kind} {facts.location}" + (f" (MaxText {facts.version})" if facts.version else "")
    origin = facts.origin
    lines = [f"read: {where}"]
    if origin.get("url"):
        how = "editable " if origin.get("editable") else ""
        at = f" at {origin['commit']}" if origin.get("commit") else ""
        lines.append(f"installed from: {how}{origin['url']}{at}")
    lines += [
        "",
        "# compat_matrix.yaml, under `maxtext:` (the code facts are read; fill in the TODOs)",
        draft_row(facts),
        "",
        "# compat_matrix.yaml, under `pin_sets:`",
        draft_pin_set(facts),
    ]
    return "\n".join(lines)
