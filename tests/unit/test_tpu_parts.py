"""tools/tpu/parts.py: the TPU tier's wheel folder cut into transfer-sized parts and joined back, byte for byte;
a missing part is named (the machine is reached by calls that carry at most 64 MiB each)."""

from __future__ import annotations

import importlib.util
import os

from helpers.shipped import REPO

_spec = importlib.util.spec_from_file_location("tpu_parts", REPO / "tools" / "tpu" / "parts.py")
parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parts)


def test_split_then_join_gives_the_same_files_and_names_a_missing_part(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    blobs = {"big.whl": os.urandom(2_500_000), "small.whl": os.urandom(300_000), "mid.whl": os.urandom(900_000)}
    for name, data in blobs.items():
        (wheels / name).write_bytes(data)
    made = parts.split(wheels, tmp_path / "parts", limit_mib=1.0)
    assert len(made) >= 4 and all(size <= parts.MIB + 4096 for _, size in made)  # 1 MiB each, manifest aside
    out = tmp_path / "joined"
    assert parts.join(out, tmp_path / "parts") == []
    assert {p.name: p.read_bytes() for p in out.iterdir()} == blobs
    # On the machine, before the last transfer: the part still to carry is named, nothing half-written is left.
    last = sorted((tmp_path / "parts").iterdir())[-1]
    for f in last.iterdir():
        if f.name != parts.MANIFEST:
            f.unlink()
    fresh = tmp_path / "fresh"
    assert parts.join(fresh, tmp_path / "parts") == [last.name]
    assert not any(p.name.endswith(".partial") for p in fresh.iterdir())
