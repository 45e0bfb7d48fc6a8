"""What the pytest plugin knows in one session: the forced or installed row, and the tiny-model factory.

Why apart from the plugin: this is the plugin's logic without pytest (typed errors from
maxtext_compat.errors, which the plugin turns into one-line failures), and resolution is lazy and
cached because the plugin is loaded in every pytest run but most runs never ask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from maxtext_compat.errors import ResolutionError

if TYPE_CHECKING:
    from maxtext_compat.matrix import CompatMatrix, MaxTextRow
    from maxtext_compat.resolution.resolver import Resolution
    from maxtext_compat.testing.tiny_models import TinyMaxText

OPTION = "--maxtext-compat-row"
MARKER = "maxtext_release"


class PluginState:
    """Per-session answers (one per pytest config, so nested pytester sessions stay independent)."""

    def __init__(self, forced: str | None) -> None:
        self.forced = forced
        self._forced: Resolution | None = None
        self._installed: Resolution | None = None
        self._installed_error: Exception | None = None
        self._factory: TinyMaxText | None = None

    @property
    def matrix(self) -> CompatMatrix:
        from maxtext_compat.matrix import load_matrix

        return load_matrix()

    def check_forced(self) -> None:
        """Resolve the forced row (ResolutionError naming the rows when it is not one)."""
        from maxtext_compat.resolution.resolver import resolve

        assert self.forced is not None
        rows = self.matrix.maxtext
        try:
            known = any(Version(self.forced) == r.release for r in rows)
        except InvalidVersion:
            known = False
        if not known:
            raise ResolutionError(
                f"{OPTION} {self.forced!r} names no row of {self.matrix.source}",
                expected=f"one of {', '.join(r.name for r in rows)}",
                fix="pass one of them, or drop the option to use the installed MaxText",
            )
        self._forced = resolve({"maxtext": self.forced}, matrix=self.matrix)

    @property
    def forced_row(self) -> MaxTextRow | None:
        return None if self._forced is None else self._forced.maxtext

    def installed(self) -> Resolution:
        """The installed versions' resolution (computed once; a resolver error is re-raised on every ask)."""
        if self._installed is None and self._installed_error is None:
            from maxtext_compat.resolution.installed import installed_resolution

            try:  # a nearest-row match is shown by installed_label(), not warned
                self._installed = installed_resolution().resolution
            except Exception as exc:
                self._installed_error = exc
        if self._installed_error is not None:
            raise self._installed_error
        assert self._installed is not None
        return self._installed

    def row(self) -> MaxTextRow | None:
        """The row tests run against: the forced one, else the installed release's (None: no MaxText)."""
        return self.forced_row if self.forced is not None else self.installed().maxtext

    def installed_label(self) -> str:
        res = self.installed()
        info = res.versions.get("maxtext")
        if info is None or res.maxtext is None:
            return "MaxText is not installed"
        row = f"row {res.maxtext.name}" + ("" if res.maxtext_match == "exact" else f", {res.maxtext_match} match")
        return f"MaxText {info.version} is installed ({row})"

    def describe(self) -> str:
        if self.forced is None:
            return self.installed_label()
        return f"MaxText row {self.forced} is forced by {OPTION} ({self.installed_label()})"

    def release(self) -> Version | None:
        """The version a `maxtext_release` marker is matched against (None: no MaxText)."""
        if self.forced_row is not None:
            return self.forced_row.release
        res = self.installed()
        info = res.versions.get("maxtext")
        if info is None:
            return None
        return info.parsed or (res.maxtext.release if res.maxtext else None)

    def factory(self, fixture: str) -> TinyMaxText:
        """The session's tiny-model factory; ResolutionError unless a real MaxText matches the row."""
        res = self.installed()
        if res.maxtext is None:
            raise ResolutionError(
                f"{fixture} builds a real MaxText model, but MaxText is not installed",
                fix=f"install a MaxText release (maxtext-compat envs lists working pins), or skip the test with "
                f"@pytest.mark.{MARKER}(...)",
            )
        if self.forced_row is not None and self.forced_row.name != res.maxtext.name:
            raise ResolutionError(
                f"{fixture} builds a real model of the installed release, but {OPTION} {self.forced} forces a "
                f"mocked row ({self.installed_label()})",
                fix=f"drop {OPTION} for tests that need a model, or pass {OPTION} {res.maxtext.name}",
            )
        if self._factory is None:
            from maxtext_compat.testing.tiny_models import TinyMaxText

            self._factory = TinyMaxText(res.maxtext)
        return self._factory
