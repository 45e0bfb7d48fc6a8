"""How long each environment's run takes with a cold and with a warm JAX compilation cache.

Why two figures: an environment's suite compiles hundreds of XLA programs, and JAX's persistent
cache turns most of those compiles into reads. maxtext-0.2.5 took 1,794 s on a fresh machine and
1,022 s on a warm one; a plan made from the warm figures alone puts the two longest environments of
a fresh machine one after the other. So every run records which case it was (`caches.cache_is_cold`
of its own cache folder when it started), and the scheduler plans each environment from the figure that
matches its cache now (the other figure where that one was never measured).

File format (tests/env_durations.json, demo_durations.json): `{"env": {"cold": s, "warm": s}}`, either
key optional; a bare number (an older file) is a warm figure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

COLD, WARM = "cold", "warm"


@dataclass(frozen=True)
class Recorded:
    """One environment's recorded seconds: `cold` measured with an empty compilation cache, `warm` with its
    entries from an earlier run (None: not measured)."""

    cold: float | None = None
    warm: float | None = None

    def planned(self, cold: bool) -> float:
        """The figure for a run with this cache state, else the one measured (0.0 when neither was)."""
        first, second = (self.cold, self.warm) if cold else (self.warm, self.cold)
        return first if first is not None else second if second is not None else 0.0

    def longest(self) -> float:
        """The larger figure: what a time limit must allow whichever case a run turns out to be."""
        return max((s for s in (self.cold, self.warm) if s is not None), default=0.0)

    def as_json(self) -> dict[str, int]:
        return {k: round(v) for k, v in ((COLD, self.cold), (WARM, self.warm)) if v is not None}


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _entry(value: object) -> Recorded | None:
    if (warm := _seconds(value)) is not None:  # an older file: one figure, measured warm
        return Recorded(warm=warm)
    if isinstance(value, dict):
        entry = Recorded(cold=_seconds(value.get(COLD)), warm=_seconds(value.get(WARM)))
        return entry if entry.cold is not None or entry.warm is not None else None
    return None


def read(path: Path | None) -> dict[str, Recorded]:
    """The recorded figures (empty when the file is missing or unreadable; entries it cannot read are left out:
    an environment with no figure is planned as an unknown one, i.e. first)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(name): entry for name, value in data.items() if (entry := _entry(value)) is not None}


def write(path: Path, seconds: Mapping[str, float], cold: Collection[str]) -> Path:
    """Record these environments' seconds (in whole seconds), each as its cold figure when its name is in
    `cold`, else as its warm one; every other figure in the file is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read(path)
    for name, s in seconds.items():
        old = data.get(name, Recorded())
        data[name] = Recorded(cold=s, warm=old.warm) if name in cold else Recorded(cold=old.cold, warm=s)
    doc = {name: data[name].as_json() for name in sorted(data)}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def planned(recorded: Mapping[str, Recorded], cold: Callable[[str], bool]) -> dict[str, float]:
    """Seconds per environment for this run: each from the figure matching `cold(name)`."""
    return {name: entry.planned(cold(name)) for name, entry in recorded.items()}
