"""Calls MaxText makes inside a backported vLLM step (the vllm-backport shim's `inner_call`), without jax.

Code moved by `maxtext-compat migrate` names its KV arguments with None (`x, _ = attention(...,
kv_cache=None, attention_metadata=None)`): inside a step such a call gets the new return with no cache,
an unnamed call MaxText's old return, and a call that hands over a cache of its own is refused (the
step's session already gives each layer its cache). The fake `call` records what reaches MaxText. The
real path is tests/compat/test_migrate_maxtext_source.py (MaxText 0.1.0, migrated, under the shim).
"""

from __future__ import annotations

from typing import Any

import pytest

from maxtext_compat.backport.call import inner_call
from maxtext_compat.convention.kinds import KINDS
from maxtext_compat.errors import BackportError
from maxtext_compat.matrix import load_matrix

pytestmark = pytest.mark.envs("unit")  # plain Python with fake calls: once per matrix run is enough

ROW = load_matrix().row("0.1.0")  # the backport's release: its rows' returns are the old ones
OUT = object()  # stands for an output array: identity shows it is returned untouched


class Recorder:
    def __init__(self, result: Any) -> None:
        self.result = result
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.result


@pytest.mark.parametrize(
    ("kind", "native", "want"),
    [
        ("attention", OUT, (OUT, None)),
        ("decoder_layer", OUT, (OUT, None)),  # unscanned: y
        ("decoder_layer", (OUT, None), (OUT, None)),  # scanned: (y, None), not ((y, None), None)
        ("decoder", (OUT, "hidden"), (OUT, "hidden", None)),
    ],
)
def test_a_call_naming_its_kv_arguments_gets_the_new_return_and_maxtext_never_sees_them(kind, native, want):
    kv = "kv_caches" if kind == "decoder" else "kv_cache"
    call = Recorder(native)
    kwargs = {"deterministic": True, kv: None, "attention_metadata": None}
    got = inner_call(kind, ROW, call, ("x",), kwargs, "L.__call__")
    assert got == want and got[0] is OUT
    [(args, kwargs)] = call.calls
    assert args == ("x",) and kv not in kwargs and "attention_metadata" not in kwargs
    assert kwargs.get("model_mode") == ("train" if kind == "attention" else None)  # MaxText's own cache skipped


@pytest.mark.parametrize("kind", ["attention", "decoder_layer", "decoder"])
def test_a_call_naming_no_kv_argument_gets_maxtexts_own_return(kind):
    call = Recorder(OUT)
    assert inner_call(kind, ROW, call, (), {"deterministic": True}, "L.__call__") is OUT


@pytest.mark.parametrize(
    ("kind", "kwargs", "argument"),
    [
        ("attention", {"kv_cache": "pages", "attention_metadata": None}, "kv_cache"),
        ("decoder_layer", {"kv_cache": None, "attention_metadata": "md"}, "attention_metadata"),
        ("decoder", {"kv_caches": ["pages"]}, "kv_caches"),
        ("transformer", {"kv_caches": None}, "kv_caches"),  # a model called inside a model's step
    ],
)
def test_a_second_cache_inside_a_step_is_refused_before_maxtext_runs(kind, kwargs, argument):
    call = Recorder(OUT)
    with pytest.raises(BackportError) as info:
        inner_call(kind, ROW, call, (), kwargs, "L.__call__")
    assert info.value.argument == argument and "outermost" in info.value.fix
    assert "L.__call__" in str(info.value) and call.calls == []


def test_the_transformer_has_no_shape_without_its_session():
    with pytest.raises(ValueError, match="transformer"):
        KINDS["transformer"].new_shape(ROW, OUT, None, "T.__call__")
