"""A fingerprint of a process's plugin state, and the refusal when a worker's differs from the engine's.

What it holds (what the hosts of one SPMD program must agree on): the resolved matrix rows, the installed
versions, the shim profiles applied (by name, with the versions they were applied over) and the effective
MAXTEXT_COMPAT_* settings (serving.settings). `digest` is a stable hash of those fields (sorted JSON, sha256);
host and pid are left out of it and kept beside it, so two hosts set up alike have one digest.

How the engine's reaches a worker: the plugin in the engine core writes it into vLLM's config
(`additional_config['maxtext_compat_engine']`) before the executor starts the workers, and vLLM ships that config
to every worker, whose plugin compares it with its own (`check_against`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from maxtext_compat.errors import PluginMismatchError
from maxtext_compat.serving import settings

ENGINE_KEY = "maxtext_compat_engine"  # additional_config[ENGINE_KEY] = the engine's Fingerprint.as_dict()
PACKAGES = ("maxtext_compat", "maxtext", "tpu_inference", "vllm", "jax", "flax")


@dataclass(frozen=True)
class Fingerprint:
    fields: Mapping[str, Any]  # rows, versions, profiles, settings: JSON values
    host: str = ""
    pid: int = 0
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        text = json.dumps(self.fields, sort_keys=True, separators=(",", ":"), default=str)
        object.__setattr__(self, "digest", hashlib.sha256(text.encode()).hexdigest()[:16])

    def as_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "host": self.host, "pid": self.pid, **json.loads(json.dumps(self.fields))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        fields = {k: v for k, v in data.items() if k not in ("digest", "host", "pid")}
        return cls(fields, host=str(data.get("host", "")), pid=int(data.get("pid", 0) or 0))


def compute(
    *,
    rows: Mapping[str, Any],
    versions: Mapping[str, Any],
    profiles: Iterable[str],
    effective: Mapping[str, object],
    model: str | None = None,
) -> Fingerprint:
    """A fingerprint from its readable parts (the plugin passes this process's; tests pass their own)."""
    fields = {
        "rows": dict(rows),
        "versions": {k: versions[k] for k in sorted(versions)},
        "profiles": sorted(set(profiles)),
        "settings": dict(effective),
        "model": model,
    }
    return Fingerprint(fields, host=socket.gethostname(), pid=os.getpid())


def current(model: str | None = None, resolution: Any = None) -> Fingerprint:
    """This process's fingerprint: its resolution (or the installed one), active profiles, effective settings."""
    import importlib.metadata

    from maxtext_compat.patching.ledger import active_patches

    if resolution is None:
        from maxtext_compat.errors import CompatError
        from maxtext_compat.resolution.resolver import resolve

        try:
            resolution = resolve()
        except CompatError:
            resolution = None
    rows: dict[str, Any] = {"maxtext": None, "tpu_inference": None}
    if resolution is not None:
        row = resolution.maxtext
        rows = {
            "maxtext": None if row is None else row.name,
            "tpu_inference": None if resolution.tpu_inference is None else str(resolution.tpu_inference.versions),
        }
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    profiles = [p.profile for p in active_patches()]
    return compute(rows=rows, versions=versions, profiles=profiles, effective=settings.effective(), model=model)


def differences(engine: Fingerprint, mine: Fingerprint) -> list[tuple[str, Any, Any]]:
    """(field, engine's value, this process's) for each readable field that differs, e.g. settings.rpa_kernel."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(engine.fields) | set(mine.fields)):
        a, b = engine.fields.get(key), mine.fields.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += [(f"{key}.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            out.append((key, a, b))
    return out


def _fix(diffs: list[tuple[str, Any, Any]]) -> str:
    names = [name.split(".", 1)[1] for name, _, _ in diffs if name.startswith("settings.")]
    if names:
        env = ", ".join(settings.BY_KEY[n].env for n in names if n in settings.BY_KEY)
        return (f"give {', '.join(names)} in --additional-config '{{\"{settings.CONFIG_KEY}\": {{...}}}}' (it reaches "
                f"every host) instead of the environment ({env}), or set it alike on every host")  # fmt: skip
    return "install the same versions of maxtext-compat, MaxText, tpu-inference, vLLM and jax on every host"


def check_against(engine: Mapping[str, Any], mine: Fingerprint) -> None:
    """Refuse start-up (PluginMismatchError) when this process's plugin state differs from the engine's."""
    theirs = Fingerprint.from_dict(engine)
    if theirs.digest == mine.digest:
        return
    diffs = differences(theirs, mine) or [("digest", theirs.digest, mine.digest)]
    shown = "; ".join(f"{name}: engine {a!r}, here {b!r}" for name, a, b in diffs)
    raise PluginMismatchError(
        f"the maxtext-compat plugin on host {mine.host} (pid {mine.pid}) is set up differently from the engine's "
        f"on host {theirs.host or '?'}: the hosts of one program would run differently patched code",
        host=mine.host,
        differences=diffs,
        argument=", ".join(name for name, _, _ in diffs),
        expected=f"the engine's fingerprint {theirs.digest}",
        found=f"{mine.digest} ({shown})",
        fix=_fix(diffs),
    )
