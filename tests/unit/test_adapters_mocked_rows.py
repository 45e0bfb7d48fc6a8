"""Adapters against every matrix row, in seconds and without jax (each release also has a real environment).

Each fake native class has the exact `__call__` signature of that release (copied from its
wheel) and records the call it receives; the tests assert that call, so the adapter's choice
of call form per release is visible. No jax or MaxText is needed here.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import pytest

from helpers.fake_write_path import checkless_write_path  # noqa: F401  (a fixture)
from helpers.shipped import shipped_matrix
from maxtext_compat.adapters.wrapper import adapted_class
from maxtext_compat.convention import policy
from maxtext_compat.errors import InvalidArgumentError, KVCacheNotUpdatedError, OldConventionError

MATRIX = shipped_matrix()
RELEASES = [r.name for r in MATRIX.maxtext]

# Attention.__call__ parameter lists per release, as read from the maxtext 0.1.0 .. 0.2.5 wheels.
ATTENTION_SIGS = {
    "0.1.0": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, model_mode='train', "
    "deterministic=False, previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None",
    "0.2.0": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, page_state=None, "
    "bidirectional_mask=None, rope_kwargs=None, kv_cache=None, attention_metadata=None",
    "0.2.3": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None",
}
ATTENTION_SIGS["0.2.1"] = ATTENTION_SIGS["0.2.2"] = ATTENTION_SIGS["0.2.0"]
ATTENTION_SIGS["0.2.4"] = ATTENTION_SIGS["0.2.5"] = ATTENTION_SIGS["0.2.3"]

# LlamaDecoderLayer.__call__ tails: #3372 (0.2.2) moved previous_chunk before slot.
LLAMA_SIGS = {
    "0.1.0": "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, slot=None, page_state=None, "
    "previous_chunk=None",
    "0.2.0": "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, slot=None, page_state=None, "
    "previous_chunk=None, kv_cache=None, attention_metadata=None",
    "0.2.2": "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, previous_chunk=None, "
    "slot=None, page_state=None, kv_cache=None, attention_metadata=None",
    "0.2.3": "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, previous_chunk=None, "
    "slot=None, kv_cache=None, attention_metadata=None",
}
LLAMA_SIGS["0.2.1"] = LLAMA_SIGS["0.2.0"]
LLAMA_SIGS["0.2.4"] = LLAMA_SIGS["0.2.5"] = LLAMA_SIGS["0.2.3"]


@pytest.fixture(autouse=True)
def _routing_only(checkless_write_path):  # noqa: F811
    """The fakes' strings stand in for caches and metadata: the write path records them (no jax here to check
    arrays with); a real cache's checks are tests/compat's."""
    return checkless_write_path


@dataclasses.dataclass
class FakeConfig:
    attention: str = "vllm_rpa"
    scan_layers: bool = False


def fake_class(name: str, params: str, returns: str, *, kv_return: Any = "written") -> type:
    """A class whose __call__ has exactly `params` and records the call it receives."""
    ns: dict[str, Any] = {}
    exec(  # builds a function with the release's exact signature
        f"def __call__(self, {params}):\n"
        "    call = dict(locals()); call.pop('self')\n"
        "    self.calls.append(call)\n"
        "    return self._answer(call)\n",
        ns,
    )

    def _answer(self, call):
        kv = call.get("kv_cache")
        new_kv = None if kv is None else self.kv_return(kv)
        return {"out": "OUT", "(out, kv)": ("OUT", new_kv), "(y, kv)": ("Y", new_kv)}[returns]

    def __init__(self, model_mode="train", config=None):
        self.calls = []
        self.model_mode = model_mode
        self.config = config or FakeConfig()
        self.kv_return = (lambda kv: f"{kv}+written") if kv_return == "written" else kv_return

    return type(name, (), {"__call__": ns["__call__"], "_answer": _answer, "__init__": __init__})


def attention(release: str, **kw) -> tuple[Any, Any]:
    row = MATRIX.row(release)
    returns = "out" if row.convention == "legacy" else "(out, kv)"
    native_cls = fake_class("Attention", ATTENTION_SIGS[release], returns, **kw)
    return row, adapted_class(native_cls, row=row, kind="attention")


def layer(release: str) -> tuple[Any, Any]:
    row = MATRIX.row(release)
    returns = "out" if row.convention == "legacy" else "(y, kv)"
    return row, adapted_class(
        fake_class("LlamaDecoderLayer", LLAMA_SIGS[release], returns), row=row, kind="decoder_layer"
    )


@pytest.mark.parametrize("release", RELEASES)
def test_old_call_is_made_by_keyword_and_returns_out(release):
    _, cls = attention(release)
    a = cls()
    assert a("x", "x", "pos", "seg", model_mode="train", deterministic=True) == "OUT"
    (call,) = a.calls
    assert call["inputs_q"] == "x" and call["inputs_positions"] == "pos" and call["decoder_segment_ids"] == "seg"
    assert call["model_mode"] == "train" and call["deterministic"] is True
    assert "kv_cache" not in call or call["kv_cache"] is None


@pytest.mark.parametrize("release", [r for r in RELEASES if r != "0.1.0"])
def test_new_call_forwards_cache_and_metadata_and_returns_both(release, _routing_only):
    _, cls = attention(release)
    a = cls()
    out, kv = a("x", "x", "pos", None, model_mode="autoregressive", kv_cache="KV", attention_metadata="MD")
    assert (out, kv) == ("OUT", "KV+written")
    (checked,) = _routing_only.prepared  # the writing call went through the write path's checks first
    assert checked.kv == "KV" and checked.metadata == "MD"
    assert a.calls[0]["kv_cache"] == "KV" and a.calls[0]["attention_metadata"] == "MD"
    assert a.calls[0]["model_mode"] == "autoregressive"


@pytest.mark.parametrize("release", RELEASES)
def test_page_state_none_is_dropped_where_gone_and_passed_where_present(release):
    row, cls = attention(release)
    a = cls()
    a("x", "x", page_state=None)
    assert ("page_state" in a.calls[0]) == ("page_state" in row.params.attention)


@pytest.mark.parametrize("release", ["0.2.3", "0.2.4", "0.2.5"])
def test_page_state_with_a_value_is_refused_from_0_2_3(release):
    _, cls = attention(release)
    with pytest.raises(InvalidArgumentError, match=rf"MaxText {release}.*PR #3948"):
        cls()("x", "x", page_state="pages")


@pytest.mark.parametrize("release", ["0.2.0", "0.2.1", "0.2.2"])
def test_page_state_with_a_value_passes_through_before_0_2_3(release):
    _, cls = attention(release)
    a = cls()
    a("x", "x", page_state="pages")
    assert a.calls[0]["page_state"] == "pages"


@pytest.mark.parametrize("release", RELEASES)
def test_out_sharding_in_its_0_2_positional_slot(release):
    row, cls = attention(release)
    a = cls()
    if row.convention == "legacy":
        # 0.1.0 has no out_sharding: the adapter constrains the output itself (needs jax: see compat tests)
        sig = inspect.signature(cls.__call__)
        assert list(sig.parameters)[5] == "out_sharding"
        return
    a("x", "x", "pos", "seg", "SHARDING")
    assert a.calls[0]["out_sharding"] == "SHARDING"


@pytest.mark.parametrize("release", RELEASES)
def test_decoder_layer_tail_is_passed_by_keyword_whatever_the_release_order(release):
    _, cls = layer(release)
    a = cls()
    a("x", "seg", "pos", True, "train", previous_chunk="PC", slot=3)
    call = a.calls[0]
    assert call["previous_chunk"] == "PC" and call["slot"] == 3


@pytest.mark.parametrize("release", [r for r in RELEASES if r != "0.1.0"])
def test_decoder_layer_old_and_new_returns(release):
    _, cls = layer(release)
    a = cls()
    assert a("x", "seg", "pos", True, "train") == "Y"
    assert a("x", "seg", "pos", True, "autoregressive", kv_cache="KV", attention_metadata="MD") == ("Y", "KV+written")


@pytest.mark.parametrize("release", [r for r in RELEASES if r != "0.1.0"])
def test_scanned_layer_old_call_keeps_y_none(release):
    _, cls = layer(release)
    a = cls(config=FakeConfig(scan_layers=True))
    a._answer = lambda call: ("Y", None)  # what a scanned layer returns natively
    assert a("x", "seg", "pos", True, "train") == ("Y", None)


def test_legacy_new_call_goes_to_the_backport(mocker):
    row, cls = attention("0.1.0")
    backport = mocker.patch("maxtext_compat.backport.call.backport_call", return_value=("OUT", "KV2"))
    out = cls()("x", "x", "pos", None, model_mode="autoregressive", kv_cache="KV", attention_metadata="MD")
    assert out == ("OUT", "KV2")
    _, native_call, kind, row_arg, t, writes, _, ensure_hooks = backport.call_args.args
    assert callable(ensure_hooks)  # the call site's write path says how the hooks get installed
    assert callable(native_call)
    assert kind == "attention" and row_arg is row and writes is True
    assert t.kv == "KV" and t.metadata == "MD" and "kv_cache" not in t.kwargs
    assert t.kwargs["model_mode"] == "autoregressive"


# ----------------------------------------------------------------------------------------------
# Deprecation policy
# ----------------------------------------------------------------------------------------------


def _with_policy(release: str, policy_name: str, ends_in: str | None = None):
    row = MATRIX.row(release)
    dep = dataclasses.replace(row.deprecation, policy=policy_name, ends_in=ends_in or "0.9.0")
    row = dataclasses.replace(row, deprecation=dep)
    returns = "out" if row.convention == "legacy" else "(out, kv)"
    return adapted_class(fake_class("Attention", ATTENTION_SIGS[release], returns), row=row, kind="attention")


@pytest.fixture(autouse=True)
def _reset_policy():
    policy.set_deprecation_policy(None)
    policy.set_strict(None)
    yield
    policy.set_deprecation_policy(None)
    policy.set_strict(None)


def test_warn_policy_warns_once_per_call_site_with_the_migration_line():
    a = _with_policy("0.2.5", "warn")()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            a("x", "x")  # one call site, three calls
        a("x", "x")  # a second call site
    dep = [w for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(dep) == 2
    assert dep[0].filename == __file__ and dep[0].lineno != dep[1].lineno
    assert "out, kv_cache = attention(...)" in str(dep[0].message) and "removed in 0.9.0" in str(dep[0].message)


def test_error_policy_raises_with_the_fix():
    a = _with_policy("0.2.5", "error")()
    with pytest.raises(OldConventionError, match="out, kv_cache = attention"):
        a("x", "x")
    # the new call is unaffected
    assert a("x", "x", model_mode="autoregressive", kv_cache="KV", attention_metadata="MD")[1] == "KV+written"


def test_ignore_policy_is_silent_and_the_user_can_override_it(monkeypatch):
    a = _with_policy("0.2.5", "ignore")()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a("x", "x")
    policy.set_deprecation_policy("error")
    with pytest.raises(OldConventionError):
        a("x", "x")
    policy.set_deprecation_policy(None)
    monkeypatch.setenv(policy.POLICY_ENV, "error")
    with pytest.raises(OldConventionError):
        a("x", "x")


def test_the_deadline_holds_whatever_the_policy():
    a = _with_policy("0.2.5", "ignore", ends_in="0.2.5")()
    with pytest.raises(OldConventionError, match=r"removed in 0\.2\.5"):
        a("x", "x")


def test_bad_policy_names_are_typed_errors(monkeypatch):
    with pytest.raises(InvalidArgumentError, match="ignore"):
        policy.set_deprecation_policy("sometimes")
    monkeypatch.setenv(policy.POLICY_ENV, "loud")
    with pytest.raises(InvalidArgumentError, match=policy.POLICY_ENV):
        _with_policy("0.2.5", "ignore")()("x", "x")


# ----------------------------------------------------------------------------------------------
# Strict mode
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kv_return,what",
    [(lambda kv: kv, "the KV cache unchanged"), (lambda kv: None, "no KV cache"), (lambda kv: [], "no KV cache")],
)
def test_strict_mode_refuses_a_cache_that_was_not_written(kv_return, what):
    _, cls = attention("0.2.5", kv_return=kv_return)
    a = cls()
    new = {"model_mode": "autoregressive", "kv_cache": "KV", "attention_metadata": "MD"}
    a("x", "x", **new)  # not strict: passed on
    with policy.strict_mode(), pytest.raises(KVCacheNotUpdatedError, match=what):
        a("x", "x", **new)


def test_strict_mode_ignores_train_mode_and_reads_the_environment(monkeypatch):
    _, cls = attention("0.2.5", kv_return=lambda kv: kv)
    a = cls()
    monkeypatch.setenv(policy.STRICT_ENV, "1")
    assert a("x", "x", model_mode="train", kv_cache="KV", attention_metadata="MD") == ("OUT", "KV")
    with pytest.raises(KVCacheNotUpdatedError):
        a("x", "x", model_mode="autoregressive", kv_cache="KV", attention_metadata="MD")
