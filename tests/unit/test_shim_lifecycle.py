"""One shim lifecycle (patching.shim): a subclass writes what it patches and when it applies; install, uninstall
and status are the base's, all or nothing, and a shim removed by anyone (`shims.uninstall()` too) hears it.

Each test patches a throwaway module and reads its namespace back by identity (the oracle is the module's own
`__dict__`, not the engine's ledger)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from helpers.fake_modules import make_module
from maxtext_compat import shims
from maxtext_compat.errors import ShimRefusedError
from maxtext_compat.patching import PatchSpec, profiles, shim
from maxtext_compat.patching.ledger import active_patches
from maxtext_compat.patching.settings import Setting, attribute_slot

pytestmark = pytest.mark.envs("unit")

SOURCE = "def greet(name):\n    return 'hello ' + name\n\nclass Box:\n    size = 1\n"


def _louder(original: object) -> object:
    return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs).upper()


class Louder(shim.Shim):
    """Uppercases `greet` and sets `Box.size`; records what the base told it."""

    description = "a test shim"
    verified_for = ("pytest>=7",)  # installed wherever the test runs: the range check passes

    def __init__(self, module: str, *, why_not: str | None = None, fail_after: bool = False) -> None:
        self.module, self.why_not, self.fail_after = module, why_not, fail_after
        self.calls: list[str] = []

    @property
    def name(self) -> str:  # type: ignore[override]  # one name per test module
        return f"louder-{self.module}"

    def applies(self) -> str | None:
        return self.why_not

    def specs(self) -> list[PatchSpec | Setting]:
        box = __import__(self.module).Box
        return [PatchSpec(f"{self.module}:greet", _louder), Setting(attribute_slot(box, "size"), 9, origin="test")]

    def facts(self) -> dict[str, int]:
        return {"size": 9}

    def installed_now(self, patch_set: object) -> None:
        self.calls.append("installed_now")
        if self.fail_after:
            raise RuntimeError("the shim's own step after the transaction failed")

    def removed(self) -> None:
        self.calls.append("removed")


@pytest.fixture
def module() -> Iterator[object]:
    name = f"shimlife_{uuid.uuid4().hex[:8]}"
    mod = make_module(name, SOURCE)
    before = dict(vars(mod)), dict(vars(mod.Box))
    yield mod
    assert dict(vars(mod)) == before[0] and dict(vars(mod.Box)) == before[1]  # every test leaves it as found
    import sys

    del sys.modules[name]


def _original(mod: object) -> tuple[object, object]:
    return vars(mod)["greet"], vars(mod.Box)["size"]  # type: ignore[index]


def test_install_is_all_of_it_idempotent_and_uninstall_restores_by_identity(module) -> None:
    greet, size = _original(module)
    s = Louder(module.__name__)
    st = s.install()
    assert st.active and st.name == s.name and st.reason == "installed" and st.facts == {"size": 9}
    assert module.greet("x") == "HELLO X" and module.Box.size == 9
    assert set(st.targets) >= {f"{module.__name__}:greet"} and st.verified_for == ("pytest>=7",)
    assert s.install() == st and shim.status_of(s.name) == st  # idempotent: the same status, nothing twice
    assert {p.target for p in active_patches() if p.profile == s.name} >= {f"{module.__name__}:greet"}
    assert s.uninstall() == list(st.targets)
    assert vars(module)["greet"] is greet and vars(module.Box)["size"] is size
    assert s.calls == ["installed_now", "removed"] and not profiles.installed(s.name)
    assert shim.status_of(s.name).reason == shim.NOT_ASKED


def test_shims_uninstall_removes_a_shim_and_tells_it(module) -> None:
    greet, size = _original(module)
    s = Louder(module.__name__)
    s.install()
    assert s.name in shims.uninstall()
    assert vars(module)["greet"] is greet and vars(module.Box)["size"] is size
    assert s.calls == ["installed_now", "removed"]
    assert s.name not in {st.name for st in shim.statuses() if st.active}


def test_a_shim_that_does_not_apply_patches_nothing_and_says_why(module) -> None:
    greet, _ = _original(module)
    st = Louder(module.__name__, why_not="not on this platform").install()
    assert not st.active and st.reason == "not on this platform" and st.targets == ()
    assert vars(module)["greet"] is greet and not profiles.installed(st.name)
    assert shim.status_of(st.name) == st


def test_a_failure_after_the_transaction_leaves_nothing_patched(module) -> None:
    greet, size = _original(module)
    s = Louder(module.__name__, fail_after=True)
    with pytest.raises(RuntimeError, match="after the transaction"):
        s.install()
    assert vars(module)["greet"] is greet and vars(module.Box)["size"] is size
    assert not profiles.installed(s.name) and s.calls == ["installed_now", "removed"]


def test_a_refusal_from_applies_is_typed_and_patches_nothing(module) -> None:
    greet, _ = _original(module)

    class Refusing(Louder):
        def applies(self) -> str | None:
            raise ShimRefusedError("refused", argument="jax", expected="a verified jax", found="0.0", fix="install one")

    with pytest.raises(ShimRefusedError, match="refused"):
        Refusing(module.__name__).install()
    assert vars(module)["greet"] is greet


def test_a_registered_shim_installs_by_name_and_is_listed_before_it_is_installed(module) -> None:
    s = Louder(module.__name__)
    shim.register(s)
    try:
        listed = {st.name: st for st in shim.statuses()}
        assert not listed[s.name].active and listed[s.name].verified_for == ("pytest>=7",)
        assert shims.registered_profiles()[s.name] == "a test shim"
        shims.install(s.name)  # the profile API reaches the same shim, through its own install()
        assert module.greet("x") == "HELLO X" and shim.status_of(s.name).active
        shims.uninstall(s.name)
        assert s.calls == ["installed_now", "removed"]  # one door: the shim's steps ran as in s.install()
    finally:
        shims.unregister_profile(s.name)


def test_installing_a_shim_by_name_and_through_its_install_gives_the_same_patches_facts_and_status(module) -> None:
    s = Louder(module.__name__)
    seen = []
    for install in (s.install, lambda: shims.install(s.name)):
        shim.register(s)
        try:
            install()
            seen.append((shim.status_of(s.name), module.greet("x"), module.Box.size, active_patches()))
            shims.uninstall(s.name)
        finally:
            shims.unregister_profile(s.name)
    assert seen[0] == seen[1] and seen[0][0].facts == {"size": 9} and seen[0][1:3] == ("HELLO X", 9)


def test_a_registered_shim_that_does_not_apply_installs_nothing_by_name_either(module) -> None:
    s = Louder(module.__name__, why_not="not on this machine")
    greet, size = _original(module)
    shim.register(s)
    try:
        assert shims.install(s.name) is None  # its applies() answered: nothing installed, the status says why
        assert _original(module) == (greet, size) and not shims.installed(s.name)
        assert shim.status_of(s.name).reason == "not on this machine"
    finally:
        shims.unregister_profile(s.name)


def test_doctor_lists_every_shim_the_same_way(module) -> None:
    """MaxText's own shims (registered, not installed) and one of ours (installed) in one list, one line each."""
    from maxtext_compat import doctor

    s = Louder(module.__name__)
    s.install()
    try:
        report = doctor.collect()
        listed = {entry["name"]: entry for entry in report["shims"]}
        assert listed[s.name]["active"] and listed[s.name]["verified_for"] == ["pytest>=7"]
        assert f"{module.__name__}:greet" in listed[s.name]["targets"]
        assert {"vllm-backport", "known-defects", "call-rule"} <= set(listed)
        assert not listed["vllm-backport"]["active"] and listed["vllm-backport"]["verified_for"]
        text = doctor.render(report)
        assert f"shim {s.name}: installed, {len(listed[s.name]['targets'])} target(s)" in text
        assert "shim vllm-backport: not installed in this process" in text
    finally:
        s.uninstall()


def test_a_profile_registered_over_a_shims_name_installs_as_that_plain_profile(module) -> None:
    """register_profile(name, ..., replace=True) makes the name the new builder's: installing it by name runs that
    builder, not the shim's install() (which would register its own specs again)."""
    s = Louder(module.__name__)
    shim.register(s)
    try:
        shims.register_profile(s.name, lambda: [PatchSpec(f"{module.__name__}:greet", _louder)], replace=True)
        shims.install(s.name)
        assert module.greet("x") == "HELLO X" and module.Box.size == 1 and s.calls == []  # no Setting, no shim step
        shims.uninstall(s.name)
    finally:
        shims.unregister_profile(s.name)


def test_an_installed_distribution_outside_verified_for_is_refused_unless_forced(module) -> None:
    """The base checks `verified_for` (requirement strings) before installing: pytest is installed here, and a shim
    verified for `pytest<1` is refused by either door, naming the version, the range and `force=True`; forced, it
    installs. Nothing is patched by a refusal."""
    from importlib.metadata import version

    class Unverified(Louder):
        verified_for = ("pytest<1",)

    greet, size = _original(module)
    s = Unverified(module.__name__)
    for install in (s.install, lambda: shims.install(s.name)):
        shim.register(s)
        try:
            with pytest.raises(ShimRefusedError) as err:
                install()
            found = version("pytest")
            assert (err.value.argument, err.value.expected, err.value.found) == ("pytest", "pytest<1", found)
            assert "force=True" in (err.value.fix or "") and f"pytest {found} is installed" in str(err.value)
            assert _original(module) == (greet, size) and not profiles.installed(s.name) and s.calls == []
            assert shim.status_of(s.name).reason.startswith("refused: ") and not shim.status_of(s.name).active
        finally:
            shims.unregister_profile(s.name)
    for forced in (lambda: s.install(force=True), lambda: shims.install(s.name, force=True)):
        shim.register(s)
        try:
            forced()
            assert module.greet("x") == "HELLO X" and shim.status_of(s.name).active
            assert shim.status_of(s.name).verified_for == ("pytest<1",)
            shims.uninstall(s.name)
        finally:
            shims.unregister_profile(s.name)
    assert _original(module) == (greet, size)


def test_a_range_on_a_distribution_not_installed_is_not_checked_and_a_bad_one_is_refused(module) -> None:
    """Absent distributions are left to the shim's applies() and its targets; a string that is no requirement is a
    typed error before anything is patched."""
    from maxtext_compat.errors import InvalidArgumentError

    class Elsewhere(Louder):
        verified_for = ("no-such-distribution-of-ours>=1",)

    class Prose(Louder):
        verified_for = ("maxtext 0.2.0-0.2.5 (rows with the KV parameters)",)

    st = Elsewhere(module.__name__).install()
    assert st.active and module.greet("x") == "HELLO X"
    Elsewhere(module.__name__).uninstall()
    greet, size = _original(module)
    with pytest.raises(InvalidArgumentError, match="not a requirement string"):
        Prose(module.__name__).install()
    assert _original(module) == (greet, size)


@pytest.mark.parametrize(
    ("installed", "outside"), [("0.2.5", False), ("0.2.6.dev0", False), ("0.1.0", False), ("0.3.0", True)]
)
def test_a_range_holds_dev_builds_of_its_release_line(monkeypatch, installed, outside) -> None:
    from maxtext_compat import names, versions

    monkeypatch.setattr(versions, "installed_version", lambda name: installed if name == "maxtext" else None)
    got = versions.unmet([names.MAXTEXT_RELEASES, "jax>=99"])  # jax "not installed": not checked
    assert got == ([(names.MAXTEXT_RELEASES, "maxtext", installed)] if outside else [])


def test_the_plugin_installs_its_shims_forced_only_with_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM plugin's shims on a release outside their verified range: refused at start-up (the typed error), or
    installed with MAXTEXT_COMPAT_FORCE_SHIMS=1, as force=True does in Python."""
    from maxtext_compat.errors import ShimRefusedError
    from maxtext_compat.serve.vllm_plugin import install_row_shims
    from maxtext_compat.switches import FORCE_SHIMS_ENV

    class Unverified(shims.Shim):
        name = "test-plugin-unverified"
        verified_for = ("pytest<1",)

        def specs(self):
            return []

    monkeypatch.delenv(FORCE_SHIMS_ENV, raising=False)
    try:
        with pytest.raises(ShimRefusedError, match="pytest<1"):
            install_row_shims([Unverified()])
        assert not Unverified().status().active
        monkeypatch.setenv(FORCE_SHIMS_ENV, "1")
        statuses = install_row_shims([Unverified()])
        assert statuses[Unverified.name].active and Unverified().status().active
    finally:
        Unverified().uninstall()
        shims.unregister_profile(Unverified.name)
