"""pytest plugin (entry point `pytest11`) for downstream users of maxtext-compat.

Loaded by pytest in every environment that installs maxtext-compat, so it must stay light: it
imports only pytest at load; the matrix is read when the option, the marker or a fixture is used,
and jax / MaxText only when a fixture hands out a model or an array. Tests that use none of it
run exactly as without the plugin (disable it with `-p no:maxtext_compat`).

API (see docs/pytest-plugin.md):
* `--maxtext-compat-row NAME`: act as if MaxText NAME were installed (mocked versions);
* `@pytest.mark.maxtext_release(">=0.2.2")`: skip unless the release matches (PEP 440);
* fixtures `maxtext_row`, `maxtext_convention`, `tiny_maxtext`, `tiny_maxtext_config`,
  `tiny_maxtext_model`, `paged_kv_cache`, `attention_metadata_for`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from maxtext_compat.matrix import MaxTextRow
    from maxtext_compat.pytest_plugin.state import PluginState
    from maxtext_compat.testing.conventions import ConventionCase
    from maxtext_compat.testing.paged_steps import PagedKVCache, PagedStep
    from maxtext_compat.testing.tiny_models import TinyMaxText, TinyModel

from maxtext_compat.pytest_plugin.state import MARKER, OPTION

CONVENTION = "maxtext_convention"
CONFIG_FIXTURE = "tiny_maxtext_config"
MODEL_FIXTURE = "tiny_maxtext_model"
CONFIG_GEOMETRY = {"num_kv_heads": "num_kv_heads", "head_dim": "head_dim", "num_layers": "num_decoder_layers"}
PAGED_KEYS = ("num_pages", "page_size", "num_kv_heads", "head_dim", "num_layers", "dtype", "tp", "seed")


def _failure(message: str) -> BaseException:
    """The failure of the current test or fixture, with our message only (no plugin traceback)."""
    return pytest.fail.Exception(f"maxtext-compat: {message}", pytrace=False)


def _fail(message: str) -> NoReturn:
    __tracebackhide__ = True
    raise _failure(message)


_STATE = pytest.StashKey["PluginState"]()


def _state(config: pytest.Config) -> PluginState:
    """This session's state (created in pytest_configure, or here if the plugin was registered later)."""
    state = config.stash.get(_STATE, None)
    if state is None:
        from maxtext_compat.pytest_plugin.state import PluginState

        state = config.stash[_STATE] = PluginState(config.getoption("maxtext_compat_row", None))
    return state


def _factory(config: pytest.Config, fixture: str) -> TinyMaxText:
    __tracebackhide__ = True
    try:
        return _state(config).factory(fixture)
    except Exception as exc:  # typed ResolutionError, or the resolver's own error about the installed versions
        raise _failure(
            str(exc) if _is_ours(exc) else f"{fixture} cannot resolve the installed MaxText: {exc}"
        ) from None


def _is_ours(exc: BaseException) -> bool:
    from maxtext_compat.errors import CompatError

    return isinstance(exc, CompatError)


# --------------------------------------------------------------------------------------------
# Hooks
# --------------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("maxtext-compat", "maxtext-compat (MaxText call conventions)")
    group.addoption(
        OPTION,
        dest="maxtext_compat_row",
        metavar="NAME",
        default=None,
        help="act as if MaxText NAME (a compat_matrix.yaml row, e.g. 0.2.3) were installed: maxtext_row, "
        f"{CONVENTION} and the {MARKER} marker use it; fixtures that build a real model need it to be the "
        "installed release",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*specifiers): run only when the MaxText release (installed, or forced with {OPTION}) "
        'matches the PEP 440 specifiers, e.g. ">=0.2.2" or ">=0.2.0", "<0.2.5"; skipped otherwise',
    )
    state = _state(config)
    if state.forced is not None:
        from maxtext_compat.errors import CompatError

        try:
            state.check_forced()
        except CompatError as exc:
            raise pytest.UsageError(f"maxtext-compat: {exc}") from None


def pytest_report_header(config: pytest.Config) -> str | None:
    state = _state(config)
    if state.forced is None:
        return None  # reading the matrix costs ~0.2 s: only when asked to
    try:
        return f"maxtext-compat: {state.describe()}"
    except Exception as exc:  # a header must never break the run
        return f"maxtext-compat: MaxText row {state.forced} is forced by {OPTION} ({type(exc).__name__}: {exc})"


def _parametrized_names(marker: pytest.Mark) -> list[str]:
    names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
    if isinstance(names, str):
        return [n.strip() for n in names.split(",")]
    return list(names)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `maxtext_convention` over the matrix's conventions (unless the test does it itself)."""
    if CONVENTION not in metafunc.fixturenames:
        return
    if any(CONVENTION in _parametrized_names(m) for m in metafunc.definition.iter_markers("parametrize")):
        return
    from maxtext_compat.testing.conventions import convention_cases

    state = _state(metafunc.config)
    cases = convention_cases(state.matrix, state.forced_row)
    metafunc.parametrize(CONVENTION, list(cases), indirect=True, ids=list(cases))


_MARKER_ERROR = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Turn `maxtext_release` markers into skips (a public skip marker: reported at the test's location)."""
    for item in items:
        if item.get_closest_marker(MARKER) is None:
            continue
        verdict, text = _release_verdict(item)
        if verdict == "skip":
            item.add_marker(pytest.mark.skip(reason=text))
        elif verdict == "error":
            item.stash[_MARKER_ERROR] = text


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A misused `maxtext_release` marker errors the test before its fixtures are built."""
    __tracebackhide__ = True
    message = item.stash.get(_MARKER_ERROR, None)
    if message is not None:
        _fail(message)


def _release_verdict(item: pytest.Item) -> tuple[str, str]:
    """("run" | "skip" | "error", reason) for the test's `maxtext_release` markers (all must match)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    from maxtext_compat.errors import CompatError

    parts: list[str] = []
    for m in item.iter_markers(MARKER):
        if not m.args or m.kwargs or not all(isinstance(a, str) and a.strip() for a in m.args):
            return "error", (
                f"@pytest.mark.{MARKER}{_show(m)} on {item.nodeid}: expected one or more PEP 440 specifier "
                f'strings and no keywords, e.g. @pytest.mark.{MARKER}(">=0.2.2")'
            )
        parts.extend(a.strip() for a in m.args)
    text = ",".join(parts)
    try:
        wanted = SpecifierSet(text)
    except InvalidSpecifier:
        return "error", (
            f"@pytest.mark.{MARKER}({', '.join(map(repr, parts))}) on {item.nodeid}: {text!r} is not a PEP 440 "
            'version specifier. Fix: write e.g. ">=0.2.2" or ">=0.2.0,<0.2.5"'
        )
    state = _state(item.config)
    try:
        release = state.release()
        where = state.describe()
    except CompatError as exc:
        return "error", f"@pytest.mark.{MARKER} on {item.nodeid}: {exc}"
    if release is None:
        return "skip", f"needs MaxText {wanted}; MaxText is not installed"
    if not wanted.contains(release, prereleases=True):
        return "skip", f"needs MaxText {wanted}; {where}"
    return "run", ""


def _show(m: pytest.Mark) -> str:
    args = [repr(a) for a in m.args] + [f"{k}={v!r}" for k, v in m.kwargs.items()]
    return f"({', '.join(args)})"


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def maxtext_row(pytestconfig: pytest.Config) -> MaxTextRow:
    """The compat-matrix row tests run against: the one forced by --maxtext-compat-row, else the installed one."""
    __tracebackhide__ = True
    from maxtext_compat.errors import CompatError

    try:
        row = _state(pytestconfig).row()
    except CompatError as exc:  # the installed versions are incompatible, or their metadata is unreadable
        raise _failure(f"maxtext_row: {exc}") from None
    if row is None:
        _fail(
            f"maxtext_row needs a MaxText release, but MaxText is not installed. Fix: install one, or pass "
            f"{OPTION} NAME to test against a compat_matrix.yaml row without it"
        )
    return row


@pytest.fixture
def maxtext_convention(request: pytest.FixtureRequest) -> ConventionCase:
    """One call convention per test parameter (legacy, kv_return, kv_scan_carry), each with its matrix row."""
    __tracebackhide__ = True
    from maxtext_compat.errors import CompatError
    from maxtext_compat.testing.conventions import convention_case

    if not hasattr(request, "param"):
        _fail(
            f"{CONVENTION} is parametrized at collection: request it as an argument of the test function, "
            "not through request.getfixturevalue"
        )
    state = _state(request.config)
    try:
        return convention_case(request.param, state.matrix, state.forced_row)
    except CompatError as exc:
        raise _failure(str(exc)) from None


@pytest.fixture(scope="session")
def tiny_maxtext(pytestconfig: pytest.Config) -> TinyMaxText:
    """Factory of tiny real models of the installed MaxText (`.config(spec)`, `.model(spec, fresh=False)`)."""
    __tracebackhide__ = True
    return _factory(pytestconfig, "tiny_maxtext")


def _spec_param(request: pytest.FixtureRequest, partner: str) -> Any:
    """A tiny-model spec from this fixture's indirect param, else from its partner fixture's."""
    if hasattr(request, "param"):
        return request.param
    callspec = getattr(request.node, "callspec", None)
    return None if callspec is None else callspec.params.get(partner)


def _build(request: pytest.FixtureRequest, fixture: str, partner: str, make: Callable[[TinyMaxText, Any], Any]) -> Any:
    __tracebackhide__ = True
    from maxtext_compat.errors import CompatError

    factory = _factory(request.config, fixture)
    try:
        return make(factory, _spec_param(request, partner))
    except CompatError as exc:
        raise _failure(f"{fixture}: {exc}") from None


@pytest.fixture
def tiny_maxtext_config(request: pytest.FixtureRequest) -> Any:
    """MaxText config of a tiny model (family via indirect parametrization: "qwen3" or {"family": ..., ...})."""
    __tracebackhide__ = True
    return _build(request, CONFIG_FIXTURE, MODEL_FIXTURE, lambda f, p: f.config(p))


@pytest.fixture
def tiny_maxtext_model(request: pytest.FixtureRequest) -> TinyModel:
    """A tiny real model of the installed MaxText with its mesh, context, old_call and paged_call (shared per spec)."""
    __tracebackhide__ = True
    return _build(request, MODEL_FIXTURE, CONFIG_FIXTURE, lambda f, p: f.model(p))


@pytest.fixture
def paged_kv_cache(request: pytest.FixtureRequest) -> PagedKVCache:
    """A small paged KV cache (8 pages x 16 tokens) per layer, shaped for the test's tiny model when it has one."""
    __tracebackhide__ = True
    from maxtext_compat.errors import CompatError
    from maxtext_compat.paged.layout import KVCacheLayout
    from maxtext_compat.testing import paged_steps, tiny

    given = dict(getattr(request, "param", None) or {})
    unknown = sorted(set(given) - set(PAGED_KEYS))
    if unknown:
        _fail(f"paged_kv_cache: unknown parameter(s) {unknown}; expected keys among {list(PAGED_KEYS)}")
    geometry: dict[str, Any] = {
        "num_kv_heads": tiny.TINY["base_num_kv_heads"],
        "head_dim": tiny.TINY["head_dim"],
        "num_layers": tiny.TINY["base_num_decoder_layers"],
    }
    if MODEL_FIXTURE in request.fixturenames:
        model = request.getfixturevalue(MODEL_FIXTURE)
        geometry = {"num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "num_layers": model.num_layers}
    elif CONFIG_FIXTURE in request.fixturenames:
        cfg = request.getfixturevalue(CONFIG_FIXTURE)
        geometry = {k: int(getattr(cfg, a)) for k, a in CONFIG_GEOMETRY.items()}
    geometry.update(given)
    try:
        layout = KVCacheLayout(
            geometry.get("num_pages", paged_steps.DEFAULT_PAGES),
            geometry.get("page_size", paged_steps.DEFAULT_PAGE_SIZE),
            geometry["num_kv_heads"],
            geometry["head_dim"],
            geometry.get("dtype", "float32"),
            geometry.get("tp", 1),
        )
        return paged_steps.PagedKVCache(layout, geometry["num_layers"], seed=geometry.get("seed"))
    except CompatError as exc:
        raise _failure(f"paged_kv_cache: {exc}") from None


@pytest.fixture
def attention_metadata_for(paged_kv_cache: PagedKVCache) -> Callable[..., PagedStep]:
    """`attention_metadata_for(batch)` -> a PagedStep: tpu-inference AttentionMetadata in kernel order + reordering.

    batch: [(q_len, kv_len), ...] (request ids 0..n-1) or {request_id: q_len or (q_len, kv_len)}.
    """
    return paged_kv_cache.step
