"""The one cached answer to "which release is installed": read once per miss, keyed by what it depends on,
its warnings kept and shown at the user's line."""

from __future__ import annotations

import warnings

import pytest

from maxtext_compat.errors import UnknownReleaseWarning
from maxtext_compat.resolution import installed, resolver
from maxtext_compat.versions import hypothetical_versions

pytestmark = pytest.mark.envs("unit")


@pytest.fixture
def fake_install(mocker):
    """MaxText 0.2.9 (no row: the nearest one, with a warning) as the installed versions, counted."""
    infos = hypothetical_versions({"maxtext": "0.2.9"})
    read = mocker.patch.object(installed, "installed_versions", side_effect=lambda: dict(infos))
    mocker.patch.object(installed, "_CACHE", {})
    return read


def test_a_miss_reads_the_installed_metadata_once_and_a_hit_reads_it_only_for_the_key(fake_install, mocker):
    again = mocker.spy(resolver, "installed_versions")  # resolve()'s own read: must not run
    first = installed.installed_resolution()
    assert fake_install.call_count == 1 and again.call_count == 0
    assert first.resolution.maxtext is not None and first.resolution.maxtext.name == "0.2.5"
    assert [w.category for w in first.warnings] == [UnknownReleaseWarning]
    assert installed.installed_resolution() is first and fake_install.call_count == 2  # the key, no resolve


def test_recorded_warnings_are_shown_at_the_callers_line(fake_install):
    found = installed.installed_resolution()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        found.show(only=UnknownReleaseWarning, at_call_site=True)
    assert [w.filename for w in seen] == [__file__]


def test_resolve_warns_at_the_callers_line_not_inside_the_resolver():
    with pytest.warns(UnknownReleaseWarning) as seen:
        resolver.resolve({"maxtext": "0.2.9"})
    assert [w.filename for w in seen] == [__file__]
