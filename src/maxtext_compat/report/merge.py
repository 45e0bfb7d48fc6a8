"""Joining the results of many machines (one per shard of a run) into one report.

Why strict: a merged page is read as one run. Results of another matrix or maxtext-compat version, of another
project, or two results for one environment would make a page that no run produced, so they are refused; an
environment of the run with no results is shown as such and said on the console.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix import CompatMatrix
from maxtext_compat.report.results import REPORT_FIELDS, EnvResult, write_reports

RESULTS = "compat-report.json"
SAME_RUN_KEYS = ("matrix", "maxtext_compat", "claims", "project", "selected")  # every shard of one run agrees on these


def _read(folder: Path) -> dict[str, Any]:
    path = folder / RESULTS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"no results to merge in {folder}",
            argument="--merge",
            expected=f"folders holding the {RESULTS} `maxtext-compat matrix` wrote (one per machine)",
            found=f"{path}: {exc}",
            fix="pass the folders each job uploaded (its --cache-dir, or .maxtext-compat/ of its checkout)",
        ) from None
    if not isinstance(data, dict) or "run" not in data or not isinstance(data.get("envs"), list):
        raise InvalidArgumentError(
            f"{path} is not a results file of this maxtext-compat",
            argument="--merge",
            expected='a JSON object with "run" and "envs" (maxtext-compat matrix writes it)',
            found=str(sorted(data)) if isinstance(data, dict) else type(data).__name__,
            fix="rerun the job with this maxtext-compat release",
        )
    return data


def merge(
    folders: Sequence[Path], out: Path, m: CompatMatrix, *, screenshot: bool = True, log: Callable[[str], None] = print
) -> list[EnvResult]:
    """Write one report in `out` from the results in `folders` (their junit files and logs copied beside it)."""
    if not folders:
        raise InvalidArgumentError("nothing to merge", argument="--merge", fix="pass at least one results folder")
    docs = [(folder, _read(folder)) for folder in folders]
    first_folder, first = docs[0]
    same = {k: first["run"].get(k) for k in SAME_RUN_KEYS}
    for folder, doc in docs[1:]:
        for key, value in same.items():
            if doc["run"].get(key) != value:
                raise InvalidArgumentError(
                    f"{folder} holds the results of another run than {first_folder}",
                    argument="--merge",
                    expected=f"{key} = {value!r} (as in {first_folder / RESULTS})",
                    found=f"{key} = {doc['run'].get(key)!r}",
                    fix="merge the shards of one run: same matrix, maxtext-compat release, project and selection",
                )
    if same["matrix"] != m.fingerprint():
        raise InvalidArgumentError(
            f"the results in {first_folder} were made with another compat matrix than this maxtext-compat's",
            argument="--merge",
            expected=f"matrix {m.fingerprint()} ({m.source})",
            found=f"matrix {same['matrix']}",
            fix="merge with the maxtext-compat release the jobs ran (the report is drawn from its matrix)",
        )
    where: dict[str, Path] = {}
    envs: dict[str, dict[str, Any]] = {}
    for folder, doc in docs:
        for env in doc["envs"]:
            name = env["name"]
            if name in where:
                raise InvalidArgumentError(
                    f"environment {name!r} has results in two folders",
                    argument="--merge",
                    expected="each environment in one shard's results",
                    found=f"{where[name]} and {folder}",
                    fix="pass each shard's folder once, and give every job its own --shard K/N",
                )
            where[name], envs[name] = folder, env
    selected = same["selected"] or list(envs)
    missing = [n for n in selected if n not in envs]
    if missing:
        log(f"[report] {len(missing)} environment(s) of the run have no results: {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    for name, folder in where.items():
        for sub, suffix in (("junit", ".xml"), ("logs", ".log")):
            src = folder / sub / f"{name}{suffix}"
            if src.is_file() and src.resolve() != (out / sub / src.name).resolve():
                (out / sub).mkdir(exist_ok=True)
                shutil.copyfile(src, out / sub / src.name)
    order = [n for n in selected if n in envs] + [n for n in envs if n not in selected]
    results = [EnvResult(**{k: envs[n][k] for k in REPORT_FIELDS if k in envs[n]}) for n in order]
    run = {k: v for k, v in first["run"].items() if k != "shard"} | {"merged_from": len(docs), "missing": missing}
    write_reports(results, m, out, claims=bool(same["claims"]), run=run, screenshot=screenshot)
    return results
