"""`maxtext-compat migrate --to kv_return` on MaxText releases that already follow the new convention.

Their own call sites were written for it (by PR #2616 and after), so a correct codemod finds them and changes
nothing: no rewrite (a false one would add arguments or a tuple the callee does not return) and nothing
manual. Run on 0.2.4 (26 sites in 348 files, ~30 s). Measured by hand with the same command: 0.2.2 24 sites,
0.2.3 25, all unchanged; 0.2.5 22 unchanged and one manual (`res = self.decoder(...)`, unpacked later).
"""

from __future__ import annotations

import pytest

# make test-extended's (libcst over a whole release, ~3 min): tests/unit/test_migrate*.py hold the codemod's rules.
pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.4"), pytest.mark.extended]

pytest.importorskip("libcst")

from maxtext_compat.migrate import files  # noqa: E402
from maxtext_compat.resolution.probes import package_dir  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402


def test_the_release_own_call_sites_are_found_and_left_unchanged():
    reports = files.run([package_dir(tiny.installed_row().import_root)], "kv_return", write=False)
    assert not [r.path for r in reports if r.skipped]
    sites = [(str(r.path), s) for r in reports for s in r.sites]
    assert len(sites) >= 26
    assert {s.kind for _, s in sites} >= {"attention", "decoder"}
    assert [(p, s) for p, s in sites if s.change != "unchanged"] == []
    assert not any(r.changed for r in reports)
