"""tools/tpu/parts.py: the TPU tier's wheels packed into transfer-sized parts and unpacked on the machine: every
wheel back with its members byte for byte, the first call's wheels whole in part-1, small wheels recompressed as
one xz stream, a missing part named only for the wheels a stage needs (the machine is reached by calls that carry
at most 64 MiB each)."""

from __future__ import annotations

import importlib.util
import os
import zipfile

from helpers.shipped import REPO

_spec = importlib.util.spec_from_file_location("tpu_parts", REPO / "tools" / "tpu" / "parts.py")
parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parts)
MIB = parts.MIB


def _wheel(folder, name, members):
    path = folder / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in members.items():
            z.writestr(member, data)
    return path


def _members(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _setup(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    text = b"def f():\n    return 1\n" * 40_000  # ~1 MiB of code: xz packs it far below deflate's size
    made = {
        "core_a-1.0-py3-none-any.whl": {"core_a/__init__.py": text, "core_a/blob.bin": os.urandom(200_000)},
        "core_b-2.0-py3-none-any.whl": {"core_b/__init__.py": b"x = 2\n"},
        "extra-0.1-py3-none-any.whl": {"extra/__init__.py": text[:300_000]},
        "model-0.1.2-py3-none-any.whl": {"model/weights.gguf": os.urandom(int(2.5 * MIB))},  # big: as it is
    }
    for name, members in made.items():
        _wheel(wheels, name, members)
    first = tmp_path / "first.txt"
    first.write_text("# the first stage\ncore-a==1.0\ncore_b==2.0\n")
    model = tmp_path / "model.txt"
    model.write_text("model==0.1.2\nextra==0.1\n")
    return wheels, first, model, made


def test_split_then_join_gives_every_wheel_back_with_the_first_stage_whole_in_part_1(tmp_path):
    wheels, first, _, made = _setup(tmp_path)
    out = parts.split(wheels, tmp_path / "parts", limit_mib=1.0, first=[first], big_mib=1.0)
    assert len(out) >= 3 and all(size <= MIB + 8192 for _, size in out)  # 1 MiB each, the manifest aside
    part1 = sorted(p.name for p in (tmp_path / "parts" / "part-1").iterdir())
    assert part1[0] == "bundle-1.tar.xz", part1  # whole, not a chunk
    assert (tmp_path / "parts" / "part-1" / "bundle-1.tar.xz").stat().st_size < 300_000  # xz: ~1.2 MiB of members
    got = tmp_path / "joined"
    assert parts.join(got, tmp_path / "parts") == []
    assert sorted(p.name for p in got.glob("*.whl")) == sorted(made)
    for name, members in made.items():
        assert _members(got / name) == members  # pip installs the stored wheel: same members, same bytes


def test_a_stage_needs_only_its_own_parts_and_a_missing_one_is_named(tmp_path):
    wheels, first, model, _ = _setup(tmp_path)
    parts.split(wheels, tmp_path / "parts", limit_mib=1.0, first=[first], big_mib=1.0)
    for later in sorted((tmp_path / "parts").iterdir())[1:]:  # on the machine after the first call: part-1 only
        for f in later.iterdir():
            if f.name != parts.MANIFEST:
                f.unlink()
    fresh = tmp_path / "fresh"
    assert parts.join(fresh, tmp_path / "parts", need=[first]) == []  # the first stage can install
    got = {p.name for p in fresh.glob("*.whl")}
    assert {"core_a-1.0-py3-none-any.whl", "core_b-2.0-py3-none-any.whl"} <= got  # and what else part-1 held
    assert "model-0.1.2-py3-none-any.whl" not in got
    missing = parts.join(fresh, tmp_path / "parts", need=[model])
    assert missing and "part-1" not in missing  # the model stage names the parts still to carry
    assert not any(p.name.endswith(".partial") for p in fresh.rglob("*"))


def test_a_last_stage_starts_a_part_of_its_own_and_leaves_the_earlier_parts_as_they_were(tmp_path):
    """Adding a stage's wheels with `--last` changes what no earlier part holds (the same files by name: the calls
    that carried them are the same calls), they travel as they are from the first part after, and joining them needs
    only those."""
    wheels, first, model, _ = _setup(tmp_path)
    before = tmp_path / "before"
    parts.split(wheels, before, limit_mib=1.0, first=[first], big_mib=1.0)
    late = {"late-1.0-py3-none-any.whl": {"late/model.gguf": os.urandom(int(1.5 * MIB))},
            "late_parts-1.0-py3-none-any.whl": {"late_parts/__init__.py": b"y = 1\n"}}  # fmt: skip
    for name, members in late.items():
        _wheel(wheels, name, members)
    last = tmp_path / "last.txt"
    last.write_text("late==1.0\nlate-parts==1.0\n")
    after = tmp_path / "after"
    parts.split(wheels, after, limit_mib=1.0, first=[first], big_mib=1.0, last=[last])
    old = sorted(p.name for p in before.iterdir())
    for name in old:  # the bundles are rebuilt (a tar's times differ), so what each part holds, not its bytes
        files = {f.name for f in (before / name).iterdir()} - {parts.MANIFEST}
        assert files == {f.name for f in (after / name).iterdir()} - {parts.MANIFEST}, name
    new = sorted(set(p.name for p in after.iterdir()) - set(old))
    assert new and all({f.name for f in (after / n).iterdir()} - {parts.MANIFEST} for n in new)
    held = {f.name.split(".whl")[0] + ".whl" for n in new for f in (after / n).iterdir() if f.name != parts.MANIFEST}
    assert held == set(late)  # the new parts hold the last stage's wheels and nothing else
    for n in old:  # a machine that has only the new parts can join the last stage
        for f in (after / n).iterdir():
            if f.name != parts.MANIFEST:
                f.unlink()
    got = tmp_path / "joined"
    assert parts.join(got, after, need=[last]) == []
    for name, members in late.items():
        assert _members(got / name) == members
    assert parts.join(got, after, need=[model])  # the earlier stages' parts are named as missing


def test_a_last_pin_without_its_wheel_is_refused(tmp_path):
    wheels, first, _, _ = _setup(tmp_path)
    last = tmp_path / "last.txt"
    last.write_text("absent==9.9\n")
    import pytest

    with pytest.raises(SystemExit, match=r"--last pins with no wheel.*absent"):
        parts.split(wheels, tmp_path / "parts", limit_mib=1.0, first=[first], big_mib=1.0, last=[last])
