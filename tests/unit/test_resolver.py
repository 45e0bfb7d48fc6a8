"""resolve(): every matrix row, hypothetical combinations, installs read through mocked metadata."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from helpers.shipped import shipped_matrix
from maxtext_compat import resolve
from maxtext_compat.errors import (
    IncompatibleVersionsError,
    InvalidArgumentError,
    ProbeMismatchError,
    ResolutionError,
    UnknownReleaseWarning,
)
from maxtext_compat.resolution.probes import Finding, ProbeReport

MATRIX = shipped_matrix()

# Facts from the issue / reference notes, written independently of the matrix file.
EXPECTED_CONVENTION = {
    "0.1.0": ("legacy", "MaxText"),
    "0.2.0": ("kv_return", "maxtext"),
    "0.2.1": ("kv_return", "maxtext"),
    "0.2.2": ("kv_scan_carry", "maxtext"),
    "0.2.3": ("kv_scan_carry", "maxtext"),
    "0.2.4": ("kv_scan_carry", "maxtext"),
    "0.2.5": ("kv_scan_carry", "maxtext"),
}
# tpu-inference release -> (call form, kwargs that must be accepted, model return arity)
EXPECTED_RPA = {
    "0.11.1": ("curried", set(), 3),
    "0.12.0": ("flat", set(), 3),
    "0.13.3": ("flat", set(), 3),
    "0.19.0": ("flat", set(), 3),
    "0.20.0": ("flat", set(), 4),
    "0.22.1": ("flat", {"update_kv_cache"}, 4),
    "0.25.0": ("flat", {"update_kv_cache", "use_causal_mask"}, 4),
    "0.27.0": ("flat", {"update_kv_cache", "use_causal_mask", "attn_logits_soft_cap"}, 4),
    "0.32.0": ("flat", {"update_kv_cache", "use_causal_mask", "attn_logits_soft_cap"}, 4),
}


@pytest.mark.parametrize("release", sorted(EXPECTED_CONVENTION))
def test_every_release_resolves_to_its_own_row(release):
    res = resolve({"maxtext": release}, matrix=MATRIX)
    assert res.maxtext is not None and res.maxtext.name == release
    assert res.maxtext_match == "exact"
    assert (res.convention, res.maxtext.import_root) == EXPECTED_CONVENTION[release]


@pytest.mark.parametrize("tpi", sorted(EXPECTED_RPA))
def test_tpu_inference_versions_resolve_to_call_form_kwargs_and_arity(tpi):
    res = resolve({"tpu-inference": tpi}, matrix=MATRIX)
    form, kwargs, arity = EXPECTED_RPA[tpi]
    d = res.rpa_call_form()
    assert d is not None
    assert d["form"] == form
    assert kwargs <= set(d["kwargs"])
    assert res.tpu_inference is not None and res.tpu_inference.model_return_arity == arity
    expected_module = "layers.jax" if form == "curried" else "layers.common"
    assert expected_module in d["module"]


def test_unknown_newer_release_uses_nearest_row_with_a_warning():
    with pytest.warns(UnknownReleaseWarning, match="0.2.6 is not in"):
        res = resolve({"maxtext": "0.2.6"}, matrix=MATRIX)
    assert res.maxtext.name == "0.2.5" and res.maxtext_match == "nearest"
    assert any("nearest row 0.2.5" in n for n in res.notes)


def test_unknown_release_between_rows_uses_the_one_below():
    with pytest.warns(UnknownReleaseWarning):
        res = resolve({"maxtext": "0.1.5"}, matrix=MATRIX)
    assert res.maxtext.name == "0.1.0"


def test_release_older_than_every_row_uses_the_oldest_with_a_warning():
    with pytest.warns(UnknownReleaseWarning):
        res = resolve({"maxtext": "0.0.9"}, matrix=MATRIX)
    assert res.maxtext.name == "0.1.0"


def test_dev_build_resolves_to_its_base_release_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = resolve({"maxtext": "0.2.5.dev3+g1234abc"}, matrix=MATRIX)
    assert res.maxtext.name == "0.2.5" and res.maxtext_match == "dev"


def test_incompatible_pair_names_both_versions_and_the_nearest_compatible_pairs():
    with pytest.raises(IncompatibleVersionsError) as e:
        resolve({"maxtext": "0.2.2", "tpu-inference": "0.18.0"}, matrix=MATRIX)
    msg = str(e.value)
    assert "maxtext 0.2.2" in msg and "tpu-inference 0.18.0" in msg
    assert "maxtext 0.2.2 + tpu-inference 0.20.0" in msg
    assert "maxtext 0.2.1 + tpu-inference 0.18.0" in msg


def test_update_kv_cache_release_needs_tpu_inference_0_22_0():
    """tpu-inference 0.22.0 (2026-06-08, jax 0.10.0, no vllm-tpu pins it) already takes update_kv_cache."""
    with pytest.raises(IncompatibleVersionsError, match=r"tpu-inference >=0\.22\.0"):
        resolve({"maxtext": "0.2.3", "tpu-inference": "0.21.0"}, matrix=MATRIX)
    res = resolve({"maxtext": "0.2.3", "tpu-inference": "0.22.0", "jax": "0.10.0"}, matrix=MATRIX)
    assert res.maxtext.name == "0.2.3" and "update_kv_cache" in res.tpu_inference.rpa.optional_kwargs
    assert resolve({"maxtext": "0.2.3", "tpu-inference": "0.22.1"}, matrix=MATRIX).maxtext.name == "0.2.3"


@pytest.mark.parametrize(
    ("nightly", "row_floor"),
    [("0.29.0.dev20260915", "0.29.0"), ("0.31.0.dev20261006", "0.31.0"), ("0.32.0.dev20261024", "0.31.0")],
)
def test_tpu_inference_nightly_resolves_to_the_release_it_is_built_after(nightly, row_floor):
    """Nightlies are uploaded after their named release; PEP 440 order put 0.29.0.devN in the 0.27-0.28 row."""
    with pytest.warns(UnknownReleaseWarning, match="no release it lists"):
        res = resolve({"tpu-inference": nightly}, matrix=MATRIX)
    assert f">={row_floor}" in res.tpu_inference.label
    if nightly.startswith("0.29"):
        assert "decode_query_size" in res.tpu_inference.rpa.optional_kwargs


def test_before_release_dev_builds_follow_pep_440_order():
    m = dataclasses.replace(MATRIX, dev_builds={"tpu_inference": "before_release", "maxtext": "before_release"})
    assert m.tpu_inference_row("0.29.0.dev20260915") is None  # `<0.29.0` excludes 0.29's pre-releases
    with pytest.warns(UnknownReleaseWarning, match="not covered"):
        assert ">=0.27.0" in resolve({"tpu-inference": "0.29.0.dev20260915"}, matrix=m).tpu_inference.label
    with pytest.warns(UnknownReleaseWarning, match="nearest row 0.2.4"):
        assert resolve({"maxtext": "0.2.5.dev3"}, matrix=m).maxtext.name == "0.2.4"


def test_a_nightly_counts_as_its_release_in_the_maxtext_pair_check():
    """MaxText 0.2.3 needs tpu-inference >=0.22.0: the 0.22.0 nightly is that release, not older than it."""
    with pytest.warns(UnknownReleaseWarning):
        res = resolve({"maxtext": "0.2.3", "tpu-inference": "0.22.0.dev20260608"}, matrix=MATRIX)
    assert res.maxtext.name == "0.2.3"


def test_jax_that_tpu_inference_does_not_pin_is_incompatible():
    with pytest.raises(IncompatibleVersionsError) as e:
        resolve({"tpu-inference": "0.32.0", "jax": "0.7.0"}, matrix=MATRIX)
    assert "jax 0.7.0" in str(e.value) and "jax==0.11.2" in str(e.value)


def test_vllm_tpu_pairs_with_its_own_tpu_inference():
    assert resolve({"tpu-inference": "0.22.1", "vllm-tpu": "0.22.0"}, matrix=MATRIX).tpu_inference is not None
    with pytest.raises(IncompatibleVersionsError, match=r"vllm-tpu 0\.31\.0"):
        resolve({"tpu-inference": "0.32.0", "vllm-tpu": "0.31.0"}, matrix=MATRIX)


def test_source_install_of_tpu_inference_reporting_0_0_0_uses_the_newest_row():
    with pytest.warns(UnknownReleaseWarning, match="source install"):
        res = resolve({"tpu-inference": "0.0.0"}, matrix=MATRIX)
    assert "0.32.0" in res.tpu_inference.releases


def test_bad_arguments_are_typed_errors_naming_the_argument():
    with pytest.raises(InvalidArgumentError, match=r"\[versions\].*unknown package"):
        resolve({"maxtxt": "0.2.5"}, matrix=MATRIX)
    with pytest.raises(InvalidArgumentError, match=r"versions\['maxtext'\].*PEP 440"):
        resolve({"maxtext": "latest"}, matrix=MATRIX)


# ----------------------------------------------------------------------------------------------
# Installed versions, read through importlib.metadata (mocked: these combinations are not installed)
# ----------------------------------------------------------------------------------------------


class FakeDist:
    def __init__(self, name: str, version: str, direct_url: dict | None = None):
        self.metadata = {"Name": name}
        self.version = version
        self._direct_url = direct_url

    def read_text(self, filename: str):
        if filename == "direct_url.json" and self._direct_url is not None:
            return json.dumps(self._direct_url)
        return None


def _fake_metadata(mocker, dists: dict[str, FakeDist]):
    from importlib import metadata

    def distribution(name):
        for key, d in dists.items():
            if key.lower().replace("_", "-") == name.lower().replace("_", "-"):
                return d
        raise metadata.PackageNotFoundError(name)

    return mocker.patch("maxtext_compat.versions.metadata.distribution", side_effect=distribution)


def test_installed_versions_come_from_package_metadata(mocker):
    _fake_metadata(
        mocker,
        {
            "maxtext": FakeDist("maxtext", "0.2.2"),
            "tpu-inference": FakeDist("tpu-inference", "0.20.0"),
            "jax": FakeDist("jax", "0.9.2"),
        },
    )
    res = resolve(matrix=MATRIX, probe=False)
    assert res.maxtext.name == "0.2.2"
    assert res.tpu_inference is not None and res.tpu_inference.model_return_arity == 4
    assert res.versions["jax"].version == "0.9.2"


def test_commit_pinned_install_resolves_by_source_commit(mocker):
    url = {
        "url": "https://github.com/AI-Hypercomputer/maxtext",
        "vcs_info": {"vcs": "git", "commit_id": "348355c51" + "0" * 31},
    }
    # A commit install reports the version of the nearest tag or a dev version; the commit decides.
    _fake_metadata(mocker, {"maxtext": FakeDist("maxtext", "0.0.0.dev0", url)})
    res = resolve(matrix=MATRIX, probe=False)
    assert res.maxtext.name == "0.2.2" and res.maxtext_match == "commit"


def test_commit_no_row_lists_resolves_by_version_without_crashing(mocker):
    """Found: rows without source_commit made resolve() (and doctor, wrap, shims, the plugin) raise
    AttributeError: 'NoneType' object has no attribute 'lower' for a git install at an unlisted commit."""
    assert any(r.source_commit is None for r in MATRIX.maxtext)  # the rows that crashed the lookup
    url = {"url": "https://github.com/AI-Hypercomputer/maxtext", "vcs_info": {"vcs": "git", "commit_id": "f" * 40}}
    _fake_metadata(mocker, {"maxtext": FakeDist("maxtext", "0.2.5", url)})
    res = resolve(matrix=MATRIX, probe=False)
    assert res.maxtext.name == "0.2.5" and res.maxtext_match == "exact"
    assert any("which no row lists" in n for n in res.notes)


def test_archive_url_install_carries_the_commit(mocker):
    url = {"url": "https://github.com/AI-Hypercomputer/maxtext/archive/3f36aef23aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.zip",
           "archive_info": {}}  # fmt: skip
    _fake_metadata(mocker, {"maxtext": FakeDist("maxtext", "0.2.3", url)})
    res = resolve(matrix=MATRIX, probe=False)
    assert res.maxtext_match == "commit" and res.maxtext.name == "0.2.3"


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",  # unreadable
        "[]",  # not an object
        {"vcs_info": {"vcs": "git", "commit_id": "348355c51" + "0" * 31}},  # no url: PEP 610 requires one
        {"url": "https://github.com/AI-Hypercomputer/maxtext", "vcs_info": {"vcs": "git"}},  # no commit_id
        {"url": "https://x", "vcs_info": {"vcs": "git", "commit_id": "a" * 40}, "dir_info": {}},  # two kinds
    ],
)
def test_invalid_direct_url_is_no_direct_install(mocker, raw):
    """PEP 610 is read by packaging: a file it rejects names no commit (the version decides), never a crash."""
    dist = FakeDist("maxtext", "0.2.2")
    dist.read_text = lambda name: (
        (raw if isinstance(raw, str) else json.dumps(raw)) if name == "direct_url.json" else None
    )
    _fake_metadata(mocker, {"maxtext": dist})
    res = resolve(matrix=MATRIX, probe=False)
    assert res.maxtext.name == "0.2.2" and res.maxtext_match == "exact"
    assert res.versions["maxtext"].commit is None


def test_editable_directory_install_is_seen_as_editable(mocker):
    _fake_metadata(
        mocker,
        {"maxtext": FakeDist("maxtext", "0.2.4", {"url": "file:///src/maxtext", "dir_info": {"editable": True}})},
    )
    res = resolve(matrix=MATRIX, probe=False)
    info = res.versions["maxtext"]
    assert info.editable and info.url == "file:///src/maxtext" and info.commit is None


def test_unparseable_installed_version_is_a_typed_error(mocker):
    _fake_metadata(mocker, {"maxtext": FakeDist("maxtext", "not-a-version")})
    with pytest.raises(ResolutionError, match="not a PEP 440 version"):
        resolve(matrix=MATRIX, probe=False)


def test_nothing_installed_resolves_to_no_row(mocker):
    _fake_metadata(mocker, {})
    res = resolve(matrix=MATRIX)
    assert res.maxtext is None and res.maxtext_match == "absent" and res.tpu_inference is None


def _mismatching_report():
    return ProbeReport("static", "maxtext", (Finding("Attention.__call__ return arity", "2", "1"),))


def test_probe_mismatch_warns_by_default_and_raises_in_strict_mode(mocker):
    _fake_metadata(mocker, {"maxtext": FakeDist("maxtext", "0.2.5")})
    mocker.patch("maxtext_compat.resolution.resolver.probe_static", return_value=_mismatching_report())
    with pytest.warns(UserWarning, match="disagrees with the installed MaxText"):
        res = resolve(matrix=MATRIX)
    assert res.probe is not None and not res.probe.ok
    with pytest.raises(ProbeMismatchError, match="return arity: matrix says 2, installed has 1"):
        resolve(matrix=MATRIX, strict=True)


def test_resolution_as_dict_is_json_ready():
    res = resolve({"maxtext": "0.2.5", "tpu-inference": "0.32.0", "jax": "0.11.2"}, matrix=MATRIX)
    d = json.loads(json.dumps(res.as_dict()))
    assert d["maxtext"] == "0.2.5" and d["import_root"] == "maxtext" and d["convention"] == "kv_scan_carry"
    assert d["rpa_call_form"]["form"] == "flat"
    assert d["cpu_shim_verified"] is True


def test_wrap_on_an_unknown_release_warns_at_the_callers_line(mocker):
    """Found: wrap() dropped the UnknownReleaseWarning the README promises (installed_row ignored warnings)."""
    from maxtext_compat.adapters import wrap

    class Attention:
        def __call__(self, inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *,
                     model_mode="train", deterministic=False, kv_cache=None, attention_metadata=None):  # fmt: skip
            return "OUT", kv_cache

    _fake_metadata(mocker, {"maxtext": FakeDist("maxtext", "0.9.0")})
    with pytest.warns(UnknownReleaseWarning, match="maxtext 0.9.0 is not in") as seen:
        adapted = wrap(Attention)
    assert seen[0].filename == __file__
    assert adapted._mc_row.name == "0.2.5"  # the nearest row
