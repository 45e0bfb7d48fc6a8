"""The README is a newcomer's path: short, every link alive, every figure and version held to its source.

Its versions table is generated from compat_matrix.yaml and the CI's environments, tests/environments.yaml
(tools/docs_pages.py); its recipes are run by
tests/compat/test_readme_recipes.py; the detail lives in docs/, built into the site by `make docs`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from helpers.shipped import ci_matrix

pytestmark = pytest.mark.envs("unit")

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
MATRIX = ci_matrix()  # the environments `make test` builds (tests/environments.yaml)


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}", REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prose(text: str) -> str:
    """The README without code blocks, HTML comments and the generated versions block."""
    pages = _tool("docs_pages")
    head, _, rest = text.partition(pages.VERSIONS_START)
    text = head + rest.partition(pages.VERSIONS_END)[2]
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def test_it_is_at_most_160_lines():
    """An adopter's first screens (what it fixes, install, doctor's output), the recipes, the versions: no more."""
    assert len(README.splitlines()) <= 160


def test_the_versions_table_is_generated_from_the_matrix():
    pages = _tool("docs_pages")
    wanted = pages.readme_with_versions(README, pages.versions_table(MATRIX))
    assert wanted == README, "README's versions table is stale: run `python tools/docs_pages.py`"
    for row in MATRIX.maxtext:  # every release, with the environments that install it
        assert f"| {row.name} | {row.date} | {row.convention} |" in README
    for env in MATRIX.environments.values():
        if env.maxtext:
            assert f"`{env.name}`" in README


def test_every_link_leads_to_a_file_of_the_checkout():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        assert not link.startswith("http"), f"no external links in the README: {link}"
        assert (REPO / link).is_file(), f"README links to {link}, which does not exist"


def test_every_figure_and_version_in_the_prose_is_one_the_sources_hold():
    """Versions from the matrix (releases, pins, Python), counts from the matrix and the Makefile."""
    allowed = {r.name for r in MATRIX.maxtext}
    for env in MATRIX.environments.values():
        allowed.add(env.python)
        allowed |= {v for p in ("tpu-inference", "jax", "vllm-tpu") if (v := env.pinned(p))}
    prose = _prose(README)
    found = re.findall(r"(?<![#\w.-])(\d+(?:\.\d+)+)(?![\w.])", prose)
    assert found, "the prose names versions (the supported Python at least)"
    assert set(found) <= allowed, f"versions the matrix does not hold: {sorted(set(found) - allowed)}"
    counts = re.findall(r"(?<![#\w.-])(\d+)(?![\w.])", prose)
    assert set(counts) <= {str(len(MATRIX.environments)), "1", "2", "3", "8000"}, counts
    assert f"the {len(MATRIX.environments)} environments" in prose
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "three at a time" in prose and "matrix --jobs 3" in makefile
    for python in {env.python for env in MATRIX.environments.values()}:
        assert f"Python {python}" in prose, "the README names the Python every environment is built with"


def test_the_recipes_are_in_the_site_and_tagged_for_their_test():
    pages = _tool("docs_pages")
    page = pages.recipes_page(README)
    runners = {"wrap": "compat/test_readme_recipes.py", "serve": "compat/test_readme_recipes.py",
               "matrix": "unit/test_downstream_project.py"}  # fmt: skip
    for recipe, runner in runners.items():
        tag = f"recipe: {recipe}"
        assert README.count(f"<!-- {tag} (tests/{runner} runs") == 1
        runs = (REPO / "tests" / runner).read_text(encoding="utf-8")
        assert f'_blocks("{recipe}")' in runs or f"recipe: {recipe} (tests/{runner}" in runs, runner
        assert tag in page
    assert "](docs/" not in page, "links are made relative to docs/ in the site"
