"""The pytest plugin as a downstream user meets it: pytester runs of small test files.

Every run here is in-process and needs neither jax nor MaxText (the fixtures that do are covered
in tests/compat/test_plugin_fixtures_real.py); one subprocess run proves the plugin stays light.
"""

from __future__ import annotations

import re

import pytest

from maxtext_compat.resolution.probes import detect_import_root

# Its outcomes differ with an installed MaxText: runs in every environment.
pytestmark = pytest.mark.every_env

pytest_plugins = ["pytester"]

HAS_MAXTEXT = detect_import_root() is not None
HEAVY = ("jax", "jaxlib", "flax", "maxtext", "MaxText", "tpu_inference", "vllm", "torch", "tensorflow", "numpy")

DOWNSTREAM = """
import pytest

from maxtext_compat.paged import KVCacheLayout


def test_every_convention_has_its_row(maxtext_convention):
    assert maxtext_convention.row.convention == maxtext_convention.name
    assert maxtext_convention.row.name in maxtext_convention.releases
    print("CASE", maxtext_convention.name, maxtext_convention.row.name, maxtext_convention.is_legacy)


@pytest.mark.parametrize("maxtext_convention", ["kv_return"], indirect=True)
def test_narrowed_to_one_convention(maxtext_convention):
    assert maxtext_convention.returns["attention"] == "(out, kv_cache)"


def test_a_ragged_step_in_one_line(attention_metadata_for, paged_kv_cache):
    step = attention_metadata_for([(20, 20), (1, 13)])
    assert step.metadata.request_order == (1, 0)  # the decode goes first
    assert step.request_ids == (1, 0) and step.num_tokens == 21
    assert isinstance(paged_kv_cache.layout, KVCacheLayout) and paged_kv_cache.num_layers == 2
    decode = attention_metadata_for({0: 1, 1: 1})  # continues both requests
    assert decode.metadata.kv_lens[:2] == (21, 14) and decode.metadata.num_decode == 2
    assert paged_kv_cache.allocator.pages(0) == step.metadata.pages_of(1)


@pytest.mark.parametrize("paged_kv_cache", [{"num_pages": 4, "page_size": 8, "num_layers": 3}], indirect=True)
def test_cache_geometry_from_a_param(paged_kv_cache, attention_metadata_for):
    assert paged_kv_cache.layout.capacity_tokens == 32 and paged_kv_cache.num_layers == 3
    step = attention_metadata_for({"a": 9}, max_num_tokens=16, max_num_seqs=2, pages_per_seq=2)
    assert step.max_num_tokens == 16 and step.metadata.pages_per_seq == 2


@pytest.mark.maxtext_release(">=0.0.1")
def test_any_release():
    pass


@pytest.mark.maxtext_release(">=999")
def test_a_future_release():
    pass
"""


@pytest.fixture(autouse=True)
def _no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner runs load only our plugin: other packages' plugins (hypothesis, jaxtyping) re-import on every run."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "maxtext_compat.pytest_plugin", "-p", "no:cacheprovider", *args)


def _run_autoloaded(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.RunResult:
    """As a user runs it: the plugin comes from its `pytest11` entry point."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    result = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "-p", "no:cacheprovider", *args)
    _match(result.stdout, ["plugins: *maxtext-compat-*"])
    return result


def _lines(result: pytest.RunResult) -> str:
    return "\n".join(result.outlines + result.errlines)


def _match(lines: pytest.LineMatcher, patterns: list[str]) -> None:
    """Each pattern matches a whole line, in order; `*` is the only wildcard (brackets are literal)."""
    lines.re_match_lines([_regex(p) for p in patterns])


def _match_any(lines: pytest.LineMatcher, patterns: list[str]) -> None:
    """Each pattern matches some whole line, in any order."""
    lines.re_match_lines_random([_regex(p) for p in patterns])


def _regex(pattern: str) -> str:
    return re.escape(pattern).replace(r"\*", ".*") + "$"


def _installed() -> str | None:
    import warnings

    from maxtext_compat.resolution.resolver import resolve

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = resolve(probe=False).maxtext
    return None if row is None else row.name


# ------------------------------------------------------------------------------------------------
# A downstream test file that uses the plugin as documented passes
# ------------------------------------------------------------------------------------------------


def test_downstream_file_passes_against_every_convention(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_downstream=DOWNSTREAM)
    result = _run_autoloaded(pytester, monkeypatch, "-rs", "-s")
    outcomes = {"passed": 7, "skipped": 1} if HAS_MAXTEXT else {"passed": 6, "skipped": 2}
    result.assert_outcomes(**outcomes)
    out = _lines(result)
    assert "CASE legacy 0.1.0 True" in out and "CASE kv_return 0.2.1 False" in out
    assert "CASE kv_scan_carry 0.2.5 False" in out
    if HAS_MAXTEXT:
        _match(result.stdout, [f"SKIPPED * needs MaxText >=999; MaxText {_installed()}* is installed*"])
    else:
        _match(result.stdout, ["SKIPPED * needs MaxText >=999; MaxText is not installed"])


def test_forced_row_drives_row_conventions_and_markers(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import pytest

        def test_row(maxtext_row):
            assert maxtext_row.name == "0.2.3"

        def test_only_the_forced_convention(maxtext_convention):
            assert (maxtext_convention.name, maxtext_convention.row.name) == ("kv_scan_carry", "0.2.3")
            assert maxtext_convention.forced and "0.2.5" in maxtext_convention.releases

        @pytest.mark.maxtext_release(">=0.2.2", "<0.2.4")
        def test_in_range():
            pass

        @pytest.mark.maxtext_release(">=0.2.4")
        def test_out_of_range():
            pass
        """
    )
    result = _run(pytester, "-rs", "-v", "--maxtext-compat-row", "0.2.3")
    result.assert_outcomes(passed=3, skipped=1)
    _match(
        result.stdout,
        [
            "maxtext-compat: MaxText row 0.2.3 is forced by --maxtext-compat-row (*)",
            "*test_only_the_forced_convention[kv_scan_carry] PASSED*",
            "SKIPPED * needs MaxText >=0.2.4; MaxText row 0.2.3 is forced by --maxtext-compat-row*",
        ],
    )


def test_tests_that_do_not_use_the_plugin_are_untouched(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = _run_autoloaded(pytester, monkeypatch, "--strict-markers")
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if "maxtext-compat:" in line]  # no header, warning or skip
    markers = pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--markers")
    _match(markers.stdout, ["@pytest.mark.maxtext_release(*specifiers): run only when the MaxText release*"])


def test_plugin_stays_light_through_a_session(pytester: pytest.Pytester):
    """Option, marker, conventions and the paged bookkeeping import neither jax nor MaxText."""
    pytester.makepyfile(
        f"""
        import sys
        import pytest

        @pytest.mark.maxtext_release(">=0.1.0")
        def test_light(maxtext_row, maxtext_convention, attention_metadata_for):
            attention_metadata_for([(3, 3), (1, 5)])
            assert not [m for m in {HEAVY!r} if m in sys.modules]
        """
    )
    result = pytester.runpytest_subprocess("-p", "maxtext_compat.pytest_plugin", "--maxtext-compat-row", "0.2.0")
    result.assert_outcomes(passed=1)


# ------------------------------------------------------------------------------------------------
# Misuse fails with a readable message
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["0.9.9", "latest"])
def test_unknown_row_name_is_a_usage_error_listing_the_rows(pytester: pytest.Pytester, name: str):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = _run(pytester, "--maxtext-compat-row", name)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    _match(
        result.stderr,
        [
            f"ERROR: maxtext-compat: --maxtext-compat-row '{name}' names no row of *compat_matrix.yaml. "
            "Expected: one of 0.1.0, 0.2.0, 0.2.1, 0.2.2, 0.2.3, 0.2.4, 0.2.5. Fix: pass one of them*"
        ],
    )


@pytest.mark.parametrize(
    "marker,words",
    [
        ('">=banana"', "'>=banana' is not a PEP 440 version specifier. Fix: write e.g. \">=0.2.2\""),
        ("", "expected one or more PEP 440 specifier strings and no keywords"),
        ('">=0.2.0", reason="x"', "expected one or more PEP 440 specifier strings and no keywords"),
    ],
)
def test_a_bad_marker_errors_the_test_with_the_fix(pytester: pytest.Pytester, marker: str, words: str):
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.maxtext_release({marker})\ndef test_x():\n    pass\n")
    result = _run(pytester, "--maxtext-compat-row", "0.2.5")
    result.assert_outcomes(errors=1)
    _match(result.stdout, ["*ERROR at setup of test_x*", f"maxtext-compat: @pytest.mark.maxtext_release(*{words}*"])


@pytest.mark.parametrize(
    "call,words",
    [
        ("[(5, 3)]", "InvalidArgumentError: [batch[0]] q_len exceeds kv_len. * Found: (q_len=5, kv_len=3). Fix: *"),
        ("[(0, 3)]", "InvalidArgumentError: [batch[0]] a request in a step adds at least one token*"),
        ("[20, 13]", "InvalidArgumentTypeError: [batch[0]] each request is (q_len, kv_len), or q_len in a mapping*"),
        ("'ab'", "InvalidArgumentTypeError: [batch] a batch describes the requests of one step*"),
        ("[]", "InvalidArgumentError: [batch] a step needs at least one request*"),
        ("{'a': 200}", "CacheCapacityError: [num_tokens] the KV cache has too few free pages for this request*"),
    ],
)
def test_a_bad_batch_fails_at_the_callers_line(pytester: pytest.Pytester, call: str, words: str):
    pytester.makepyfile(f"def test_step(attention_metadata_for):\n    attention_metadata_for({call})\n")
    result = _run(
        pytester,
    )
    result.assert_outcomes(failed=1)
    _match(result.stdout, [f">       attention_metadata_for({call})", f"E       maxtext_compat.errors.{words}"])
    assert "paged_steps.py" not in result.stdout.str()  # our frames are hidden: the caller's line is the story


def test_unknown_convention_and_cache_keys_name_the_choices(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("maxtext_convention", ["kv_carry"], indirect=True)
        def test_conv(maxtext_convention):
            pass

        @pytest.mark.parametrize("paged_kv_cache", [{"pages": 4}], indirect=True)
        def test_cache(paged_kv_cache):
            pass

        @pytest.mark.parametrize("paged_kv_cache", [{"page_size": 0}], indirect=True)
        def test_geometry(paged_kv_cache):
            pass

        def test_dynamic(request):
            request.getfixturevalue("maxtext_convention")
        """
    )
    result = _run(
        pytester,
    )
    result.assert_outcomes(errors=3, failed=1)
    _match_any(
        result.stdout,
        [
            "maxtext-compat: [maxtext_convention] unknown MaxText call convention. "
            "Expected: one of ['legacy', 'kv_return', 'kv_scan_carry']. Found: 'kv_carry'.*",
            "maxtext-compat: paged_kv_cache: unknown parameter(s) ['pages']; expected keys among ['num_pages', *",
            "maxtext-compat: paged_kv_cache: [page_size] KVCacheLayout: page_size has a value it cannot take*",
            "*maxtext-compat: maxtext_convention is parametrized at collection: request it as an argument*",
        ],
    )


def test_a_convention_other_than_the_forced_rows_is_refused(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("maxtext_convention", ["legacy"], indirect=True)
        def test_conv(maxtext_convention):
            pass
        """
    )
    result = _run(pytester, "--maxtext-compat-row", "0.2.0")
    result.assert_outcomes(errors=1)
    _match(
        result.stdout,
        ["maxtext-compat: [maxtext_convention] convention 'legacy' is not the convention of the forced row*"],
    )


def test_model_fixtures_refuse_a_forced_row_that_is_not_installed(pytester: pytest.Pytester):
    """No model is built: the refusal comes first (no MaxText here, or another release than the forced one)."""
    forced = "0.2.3" if _installed() != "0.2.3" else "0.2.4"
    pytester.makepyfile(
        """
        def test_model(tiny_maxtext_model):
            pass

        def test_config(tiny_maxtext_config):
            pass
        """
    )
    result = _run(pytester, "--maxtext-compat-row", forced)
    result.assert_outcomes(errors=2)
    if HAS_MAXTEXT:
        want = "maxtext-compat: tiny_maxtext_model builds a real model of the installed release, but "
        want += f"--maxtext-compat-row {forced} forces a mocked row (MaxText * is installed (row {_installed()})). "
        want += (
            f"Fix: drop --maxtext-compat-row for tests that need a model, or pass --maxtext-compat-row {_installed()}"
        )
    else:
        want = "maxtext-compat: tiny_maxtext_model builds a real MaxText model, but MaxText is not installed. Fix: *"
    _match(result.stdout, [want])


@pytest.mark.envs("unit")
def test_row_without_maxtext_or_option_names_both_fixes(pytester: pytest.Pytester):
    pytester.makepyfile("def test_row(maxtext_row):\n    pass\n")
    result = _run(
        pytester,
    )
    result.assert_outcomes(errors=1)
    _match(
        result.stdout,
        [
            "maxtext-compat: maxtext_row needs a MaxText release, but MaxText is not installed. Fix: install one, "
            "or pass --maxtext-compat-row NAME*"
        ],
    )


# ------------------------------------------------------------------------------------------------
# The helpers behind the fixtures (plain unit tests: no pytester needed)
# ------------------------------------------------------------------------------------------------


def test_convention_case_adapts_a_fake_with_its_rows_signature():
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.testing.checkless import checkless_calls
    from maxtext_compat.testing.conventions import convention_cases

    cases = convention_cases(load_matrix())
    assert list(cases) == ["legacy", "kv_return", "kv_scan_carry"]
    assert cases["kv_return"].releases == ("0.2.0", "0.2.1")
    assert str(cases["legacy"]) == "legacy (MaxText 0.1.0)" and cases["legacy"].versions() == {"maxtext": "0.1.0"}

    class Attention:
        def __call__(self, inputs_q, inputs_kv, inputs_positions=None, *, model_mode="train", kv_cache=None,
                     attention_metadata=None):  # fmt: skip
            return "OUT", kv_cache

    with checkless_calls():  # strings stand in for the cache and metadata: the write path records, no arrays here
        adapted = cases["kv_scan_carry"].adapted_class(Attention, kind="attention")
    assert adapted()("x", "x", model_mode="train") == "OUT"  # the old call gets the old return
    assert adapted()("x", "x", model_mode="autoregressive", kv_cache="KV", attention_metadata="MD") == ("OUT", "KV")


def test_batches_continue_requests_and_keep_token_counts():
    from maxtext_compat.paged import KVCacheLayout, SequenceSlice
    from maxtext_compat.testing.paged_steps import PagedKVCache

    cache = PagedKVCache(KVCacheLayout(8, 16, 1, 128), 2)
    first = cache.step({"a": (3, 10), "b": 16})  # "a" has 7 tokens cached already
    assert first.metadata.kv_lens[:2] == (10, 16) and cache.num_tokens("a") == 10
    nxt = cache.step({"a": 1, "b": 1})
    assert nxt.metadata.kv_lens[:2] == (11, 17) and len(cache.allocator.pages("b")) == 2
    cache.free("b")
    assert cache.num_tokens("b") == 0 and cache.allocator.num_free == 8 - 1
    slices = cache.step([SequenceSlice(2, 2, (), "z")])
    assert slices.request_ids == ("z",)
    with pytest.raises(Exception, match="appears twice"):
        cache.step([SequenceSlice(1, 1, (), "z"), SequenceSlice(1, 1, (), "z")])


def test_tiny_specs_parse_names_dicts_and_refuse_the_impossible():
    from maxtext_compat.errors import InvalidArgumentError, InvalidArgumentTypeError
    from maxtext_compat.matrix import load_matrix
    from maxtext_compat.testing.tiny_models import TinyMaxText, TinySpec

    assert TinySpec.parse() == TinySpec() and TinySpec.parse("qwen3").family == "qwen3"
    spec = TinySpec.parse({"family": "gemma3", "paged": True, "base_num_decoder_layers": 3})
    assert spec.overrides == (("base_num_decoder_layers", 3),) and TinySpec.parse(spec) == spec
    assert spec.label() == "gemma3 (paged, base_num_decoder_layers=3)"
    assert TinySpec.parse({"logical_axis_rules": [["a", "b"]]}).key() is None  # unhashable: built, never cached
    with pytest.raises(InvalidArgumentError, match=r"\[family\] unknown tiny model family.*'llama9'"):
        TinySpec.parse("llama9")
    with pytest.raises(InvalidArgumentTypeError, match=r"\[tiny_maxtext_model\] cannot read a tiny model spec"):
        TinySpec.parse(3)
    native = TinyMaxText(load_matrix().row("0.2.5"))  # no MaxText needed to check a spec
    with pytest.raises(InvalidArgumentError, match=r"\[tp\] the paged tiny model runs on one device"):
        native.spec({"paged": True, "tp": 2})
    assert TinyMaxText(load_matrix().row("0.1.0")).spec({"paged": True, "tp": 2}).tp == 2  # the backport shards
