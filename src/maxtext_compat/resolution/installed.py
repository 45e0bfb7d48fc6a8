"""The installed MaxText release: its matrix row, its modules, and the mesh context its calls need.

Why one module: the adapters, the shim profiles, serving, conversion and the reference loop all
ask "which release is installed and how is it called"; asking in one place gives one answer and
one warning policy. Imports MaxText (and jax) only when a property is first read.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from maxtext_compat.errors import (
    InvalidArgumentError,
    ResolutionError,
    ShimRefusedError,
    UnknownReleaseWarning,
    warn_at_call_site,
)
from maxtext_compat.locks import fork_safe_lock
from maxtext_compat.matrix import MaxTextRow, load_matrix
from maxtext_compat.resolution.probes import package_dir
from maxtext_compat.resolution.resolver import Resolution, resolve_versions
from maxtext_compat.versions import installed_versions


@dataclass(frozen=True)
class InstalledResolution:
    """The installed versions' resolution and the warnings resolving them raised (kept, not shown)."""

    resolution: Resolution
    warnings: tuple[warnings.WarningMessage, ...]

    def show(self, *, only: type[Warning] = Warning, at_call_site: bool = False) -> None:
        """Emit the recorded warnings of category `only` again: at the caller's line outside maxtext-compat,
        or here."""
        for w in self.warnings:
            if not issubclass(w.category, only):
                continue
            if at_call_site:
                warn_at_call_site(str(w.message), w.category)
            else:
                warnings.warn(str(w.message), w.category, stacklevel=3)


_LOCK = fork_safe_lock()
_CACHE: dict[tuple[object, ...], InstalledResolution] = {}


def installed_resolution(*, probe: bool = False) -> InstalledResolution:
    """Resolve the installed versions once per (matrix, installed versions, probe) in this process.

    Why cached and keyed: adapters, shim profiles, serving and the pytest plugin all ask; each asking
    `resolve()` again cost a metadata read and a matrix walk and showed its warnings its own way. The key
    is what the answer depends on, so a changed install (or a test faking one) is resolved afresh.
    A resolver error is not cached: it is raised to every caller."""
    matrix = load_matrix()
    infos = installed_versions()
    key = (id(matrix), probe, tuple(sorted((k, i.version, i.commit) for k, i in infos.items())))
    with _LOCK:
        found = _CACHE.get(key)
    if found is not None:
        return found
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = resolve_versions(infos, matrix=matrix, probe=probe)
    found = InstalledResolution(res, tuple(seen))
    with _LOCK:
        if len(_CACHE) > 16:  # a test faking many installs: the newest matter
            _CACHE.clear()
        return _CACHE.setdefault(key, found)


def installed_row(*, warn_unknown: bool = False) -> MaxTextRow:
    """The matrix row of the installed MaxText (typed error when none is installed).

    warn_unknown: an unknown release (nearest row) warns at the caller's line outside
    maxtext-compat (`wrap()` does this, as the README promises); otherwise warnings are dropped."""
    found = installed_resolution()
    if warn_unknown:
        found.show(only=UnknownReleaseWarning, at_call_site=True)
    if found.resolution.maxtext is None:
        raise ResolutionError(
            "MaxText is not installed", fix="install a MaxText release (see `maxtext-compat envs` for working pins)"
        )
    return found.resolution.maxtext


def refuse_unbridged(res: Resolution) -> None:
    """A checkout or fork whose code differs from its row where no adapter bridges it is refused whole (before
    any patch): a renamed kv_cache, a changed return, a new required keyword-only parameter. An added
    keyword-only parameter with a default changes no code fact and passes."""
    code = res.code
    if code is None or code.refusal is None:
        return
    what, row_has, found = code.refusal
    row = "no row" if res.maxtext is None else f"row {res.maxtext.name}"
    raise ShimRefusedError(
        f"MaxText from {code.source} matches no matrix row, and differs from {row} where the adapters cannot "
        f"bridge it: {what}",
        argument=what,
        expected=f"{row_has} ({row})",
        found=f"{found} (probes match {', '.join(code.rows) or 'no row'})",
        fix="keep MaxText's signature in your fork (add keyword-only arguments with defaults instead of renaming), "
        "or add a row for it: `maxtext-compat facts installed` prints a draft",
    )


@dataclass
class MaxTextApi:
    """The installed release's modules, found through its matrix row (imports MaxText lazily)."""

    row: MaxTextRow

    @cached_property
    def pyconfig(self) -> Any:
        return importlib.import_module(self.row.config.pyconfig)

    @cached_property
    def package_dir(self) -> Path:
        d = package_dir(self.row.import_root)
        if d is None:
            raise ResolutionError(f"package {self.row.import_root!r} is not importable", fix="install MaxText")
        return d

    @cached_property
    def common_types(self) -> Any:
        root = self.row.import_root
        name = "MaxText.common_types" if root == "MaxText" else "maxtext.common.common_types"
        return importlib.import_module(name)

    @cached_property
    def maxtext_utils(self) -> Any:
        root = self.row.import_root
        return importlib.import_module(f"{root}.maxtext_utils" if root == "MaxText" else "maxtext.utils.maxtext_utils")

    def cls(self, key: str) -> Any:
        ref = self.row.classes.get(key)
        if ref is None:
            raise InvalidArgumentError(
                f"MaxText {self.row.name} has no {key} class",
                argument="key",
                found=key,
                fix=f"use one of {[k for k, v in self.row.classes.items() if v is not None]}",
            )
        return ref.load()

    def layer_cls(self, family: str) -> Any:
        return self.row.decoder_layers[family].load()

    @property
    def modes(self) -> tuple[str, str, str]:
        ct = self.common_types
        return ct.MODEL_MODE_TRAIN, ct.MODEL_MODE_PREFILL, ct.MODEL_MODE_AUTOREGRESSIVE


def api(row: MaxTextRow | None = None) -> MaxTextApi:
    return MaxTextApi(row if row is not None else installed_row())


def config_mesh(cfg: Any, tp: int = 1, *, row: MaxTextRow | None = None) -> Any:
    """A mesh over the first `tp` devices (the suite runs with 4 virtual CPU devices)."""
    import jax

    devices = jax.devices()
    if len(devices) < tp:
        raise InvalidArgumentError(
            "not enough devices for this tensor-parallel degree",
            argument="tp",
            expected=f"<= {len(devices)}",
            found=tp,
            fix="set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax",
        )
    a = api(row)
    utils = a.maxtext_utils
    if hasattr(utils, "get_mesh_from_config"):
        return utils.get_mesh_from_config(cfg, devices[:tp])
    from jax.sharding import Mesh  # 0.1.0, 0.2.0, 0.2.1

    return Mesh(utils.create_device_mesh(cfg, devices[:tp]), cfg.mesh_axes)


def mesh_context(cfg: Any, mesh: Any, *, row: MaxTextRow | None = None) -> contextlib.ExitStack:
    """The mesh + logical-axis-rules context each release expects around calls."""
    import jax

    stack = contextlib.ExitStack()
    a = api(row)
    if a.row.import_root == "MaxText" or not hasattr(jax, "set_mesh"):
        from flax.linen import partitioning as nn_partitioning

        stack.enter_context(mesh)
        stack.enter_context(nn_partitioning.axis_rules(cfg.logical_axis_rules))
    else:
        from flax.core.spmd import logical_axis_rules

        stack.enter_context(jax.set_mesh(mesh))
        stack.enter_context(logical_axis_rules(cfg.logical_axis_rules))
    return stack
