"""The documentation site's build is strict: a broken link or anchor fails it, a page nobody listed is still in it.

`make docs` (run by `make test` before the matrix) builds the real site; this test builds a copy of docs/ with a
page added and a broken link, with the flags the Makefile uses, in the dev environment (where MkDocs is).
Found before: `mkdocs build --strict --quiet` exits 0 on a broken link (--quiet drops the warnings --strict counts).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers.shipped import ci_matrix

pytestmark = pytest.mark.envs("unit")

REPO = Path(__file__).resolve().parents[2]
MKDOCS = REPO / ".envs" / "dev" / "bin" / "mkdocs"


def _make_docs_flags() -> list[str]:
    recipe = re.search(r"^docs:.*\n\t(.*mkdocs build.*)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert recipe, "the Makefile has a docs target that runs mkdocs build"
    flags = recipe.group(1).split("mkdocs build", 1)[1].split()
    assert "--strict" in flags and "--quiet" not in flags and "-q" not in flags
    return [f for f in flags if f not in ("--config-file", "mkdocs.yml", "--site-dir", "build/site")]


def _build(tmp_path: Path, extra_page: str, index_tail: str) -> subprocess.CompletedProcess[str]:
    if not MKDOCS.is_file():
        pytest.fail(f"{MKDOCS} is missing: run `make setup` (make test does)")
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "brand-new.md").write_text(extra_page)
    with (docs / "index.md").open("a") as f:
        f.write(index_tail)
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(REPO / h) for h in config["hooks"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    cmd = [str(MKDOCS), "build", *_make_docs_flags(), "--config-file", str(tmp_path / "mkdocs.yml"),
           "--site-dir", str(tmp_path / "site")]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                          "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # fmt: skip


def test_a_page_left_out_of_the_nav_is_built_under_more(tmp_path):
    done = _build(tmp_path, "# A brand-new page\n\nBy another change.\n", "\n[new](brand-new.md)\n")
    assert done.returncode == 0, done.stderr[-3000:]
    index = (tmp_path / "site" / "index.html").read_text()
    nav = index[index.index('class="md-nav') :]
    assert 'href="brand-new.html" class="md-nav__link"' in nav and "A brand-new page" in nav
    assert re.search(r">\s*More\s*<", nav), "the page is filed under More"
    if not (REPO / "build" / "compat-report.json").is_file():  # no run yet: the page plans the CI's environments
        report = (tmp_path / "site" / "compat-report.html").read_text()
        for name, spec in ci_matrix().environments.items():
            if spec.maxtext or spec.pinned("tpu-inference"):  # the ones the grid places (unit has no cell)
                assert f'data-env="{name}"' in report, name


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    done = _build(tmp_path, "# Fine\n", "\n[gone](no-such-page.md) [here](adapters.md#no-such-anchor)\n")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no-such-anchor" in done.stderr
