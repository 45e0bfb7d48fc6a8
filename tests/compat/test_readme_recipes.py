"""The README's three recipes, run as written, so they cannot rot.

1. wrap: the Python block, on a legacy release (0.1.0) and a kv_scan_carry one (0.2.3, the lighter of them).
2. serve: the commands, in maxtext-0.2.4 (a serving environment with the least load): `doctor`, then the server
   the README starts (on a free port, on loopback) and the README's request to it.
3. matrix: run by tests/unit/test_downstream_project.py, in a project of its own with the wheel pip-installed (the flow
   the recipe describes).
Only the port and the host are changed from the README's text.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent


def _blocks(tag: str) -> list[str]:
    """The fenced blocks after the README's `<!-- recipe: TAG ... -->` marker, up to the next heading."""
    start = README.index(f"<!-- recipe: {tag} ")
    end = min(i for i in (README.find("\n## ", start), README.find("\n### ", start)) if i > 0)
    section = README[start:end]
    return re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S)


def _commands(block: str) -> list[str]:
    """Shell lines of a block (continuations joined, comments and `# ...` output lines dropped)."""
    lines, current = [], ""
    for raw in block.splitlines():
        line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("-d") else raw.rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return lines


@pytest.mark.needs_maxtext
@pytest.mark.envs("maxtext-0.1.0", "maxtext-0.2.3")
def test_recipe_1_wraps_an_attention_for_old_and_new_callers():
    (code,) = _blocks("wrap")
    scope: dict[str, object] = {}
    exec(compile(code, "README.md (recipe: wrap)", "exec"), scope)  # its own asserts are the check
    assert scope["kv_cache"] is None and scope["out"].shape == (2, 16, scope["cfg"].emb_dim)  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.needs_maxtext
@pytest.mark.envs("maxtext-0.2.4")
def test_recipe_2_serves_with_the_shim_and_answers_the_request(tmp_path):
    from helpers import vllm_server

    (block,) = _blocks("serve")
    pip, doctor, serve, curl = _commands(block)
    assert pip.startswith("pip install maxtext-compat")  # installed here already: the environment is built with it
    report = subprocess.run([str(BIN / doctor.split()[0]), *doctor.split()[1:]], capture_output=True, text=True,
                            timeout=300, check=True).stdout  # fmt: skip
    assert "MaxText row 0.2.4 (exact)" in report and "known-defects shim" in report, report[-2000:]

    port = vllm_server.free_port()
    argv = shlex.split(serve.rstrip("&").replace("8000", str(port)))
    assert argv[:2] == ["maxtext-compat", "serve"] and "--tiny" in argv
    srv = vllm_server.start([str(BIN / argv[0]), *argv[1:], "--host", vllm_server.LOOPBACK], port=port,
                            model="tiny", log_path=tmp_path / "serve.log", env=os.environ)  # fmt: skip
    try:
        srv.wait_ready(420.0)
        url, body = re.search(r"curl -s (\S+) .* -d '(.*)'", curl).groups()  # type: ignore[union-attr]
        request = urllib.request.Request(
            "http://" + url.replace("localhost:8000", f"{vllm_server.LOOPBACK}:{port}"),
            data=body.encode(), headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=240) as answer:
            assert answer.status == 200
            result = json.loads(answer.read())
    finally:
        srv.stop()
    asked = json.loads(body)
    assert result["model"] == asked["model"] == "tiny"
    assert result["usage"]["completion_tokens"] == asked["max_tokens"] == 8
    assert result["choices"][0]["finish_reason"] == "length"
