"""The package's imports run one way: versions → matrix → convention → kernel → write path, backport → faces.

Why a test: a layering is only as good as the check that keeps it. Every import of the package's own
modules counts, at module level, inside functions and under TYPE_CHECKING (a lazy import hides an
edge from readers, not from the design), and so does a literal `importlib.import_module("...")`.
A module must sit in a layer (a new module is placed on purpose), may import only its own layer or
lower ones, and the whole graph has no circle. The same table is docs/architecture.md's picture.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.envs("unit")

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "maxtext_compat"
MAX_LINES = 520  # "no file over ~500 lines"

# Lowest first: (the names on the layer, the layer's one job). A name covers the module and everything under it; the
# longest match wins. docs/architecture.md's table is drawn from this one (test_the_docs_draw_the_same_layers).
LAYER_TABLE: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "_version",
            "_lazy",
            "errors",
            "switches",
            "platforms",
            "names",
            "atomic_file",
            "tempdirs",
            "locks",
            "contract",
        ),
        "foundations, importing only each other: errors, settings read from the environment, locks, the contract",
    ),
    (("versions",), "the installed distributions"),
    (("matrix",), "compat_matrix.yaml as typed rows"),
    (("resolution",), "which row is installed, its probed facts and known defects"),
    (("convention",), "the call rule: what a call means on each release (no kernel, no patching engine)"),
    (("patching",), "the patching engine: transactions, the ledger, profiles (no MaxText import: hooks)"),
    (("kernel", "paged"), "tpu-inference's kernel dispatch and the paged KV cache it reads"),
    (("cpu",), "the TPU-only pieces on a CPU; production code never imports them (the kernel takes a hook)"),
    (("backport",), "a writing new call below the rule: its checks, and the 0.1.0 backport's kernel"),
    (("adapters", "shims", "serving_fixes"), "the faces users know, and the serving stack's request fixes"),
    (("decode", "serving", "convert"), "serving, checkpoints and weights, the in-process decode loops"),
    (
        (
            "testing",
            "migrate",
            "doctor",
            "demo",
            "serve",
            "pytest_plugin",
            "runner",
            "report",
            "cli",
            "_moved",
        ),
        "entry points, the pytest plugin and its kit, the compat matrix runner and its report, old paths' aliases",
    ),
)
LAYERS: tuple[tuple[str, ...], ...] = tuple(names for names, _ in LAYER_TABLE)
TOP = len(LAYERS) - 1  # `maxtext_compat/__init__.py`: the top-level face


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The package module a dotted name refers to (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "find_spec",
        ):
            names = [a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        for name in names:
            if name.startswith("maxtext_compat"):
                owner = _owner(name)
                if owner is not None and owner != module:
                    targets.add(owner)
    return targets


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def layer_of(module: str) -> int | None:
    if module == "maxtext_compat":
        return TOP
    short = module.removeprefix("maxtext_compat.")
    best: tuple[int, int] | None = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (short == name or short.startswith(name + ".")) and (best is None or len(name) > best[1]):
                best = (index, len(name))
    return None if best is None else best[0]


def test_every_module_sits_in_a_layer():
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, (
        f"place these modules in LAYERS (tests/unit/test_layering.py, docs/architecture.md): {unplaced}"
    )


def test_no_import_runs_up_the_layers():
    upward = sorted(
        f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
        for m, targets in GRAPH.items()
        for t in targets
        # a package's face may re-export what sits inside it
        if (layer_of(t) or 0) > (layer_of(m) or 0) and not t.startswith(m + ".")
    )
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_circle():
    """Every import counted as if it ran at module level (function-level ones included), and importing a module
    runs its parent packages' __init__ first: no circle, so no function-level import is there to dodge one (a
    lazy import may still keep jax or MaxText out of a light module; it never hides a circle)."""
    # A package face importing its own submodules is containment, not a circle through the package.
    edges = {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in GRAPH.items()}
    for m in GRAPH:
        parents = {m.rsplit(".", i)[0] for i in range(1, m.count("."))}
        edges[m] |= {p for p in parents if p in MODULES and p != "maxtext_compat"}
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"import circle: {' -> '.join(err.args[1])}")


def test_no_private_name_crosses_a_module():
    crossing = sorted(
        f"{m} imports {alias.name} from {node.module}"
        for m, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("maxtext_compat")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    )
    assert not crossing, "\n".join(crossing)


def test_no_module_is_over_about_500_lines():
    long = sorted(f"{m}: {n} lines" for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not long, "\n".join(long)


def test_the_checker_sees_what_it_must():
    """The graph reader itself: it must find a lazy import, a TYPE_CHECKING one and an importlib literal."""
    lazy = GRAPH["maxtext_compat.adapters.wrapper"]  # imports installed_row inside a function
    assert "maxtext_compat.resolution.installed" in lazy
    assert (
        "maxtext_compat.resolution.resolver" in GRAPH["maxtext_compat.patching.profiles"]
    )  # TYPE_CHECKING + in a function
    assert "maxtext_compat.shims.maxtext_profiles" in GRAPH["maxtext_compat.serve.vllm_plugin"]  # importlib literal
    assert layer_of("maxtext_compat.shims.maxtext_profiles") > layer_of("maxtext_compat.patching.profiles")


def test_the_call_rule_reaches_the_kernel_only_through_its_call_site():
    """The rule knows neither the kernel, the paged cache, the patching engine nor the backport, through any
    chain of imports; a call site hands it the write path, and one built without it is refused at once."""
    below_not = ("paged", "kernel", "cpu", "patching", "shims", "serving_fixes", "backport", "write_path", "adapters")
    reached: set[str] = set()
    todo = [m for m in MODULES if m.startswith("maxtext_compat.convention")]
    while todo:
        for target in GRAPH[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    short = {m.removeprefix("maxtext_compat.") for m in reached}
    assert not sorted(m for m in short if m.split(".")[0] in below_not)

    import inspect

    from maxtext_compat.convention.rule import CallSite
    from maxtext_compat.matrix import load_matrix

    sig = inspect.Signature()
    with pytest.raises(TypeError, match="write_path"):
        CallSite("attention", load_matrix().row("0.2.5"), sig, sig, "Attention.__call__")  # type: ignore[call-arg]


def test_the_patching_engine_imports_nothing_of_maxtext():
    """MaxText's parts of a profile install (the caller convention's owner, the default profile's chooser) reach the
    engine as hooks its shims set (`set_declarations`, `set_default_profile_chooser`), never as imports."""
    imports = sorted(
        f"{m}: {name}"
        for m, path in MODULES.items()
        if m.startswith("maxtext_compat.patching")
        for node in ast.walk(ast.parse(path.read_text()))
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        )
        if name.split(".")[0] in ("maxtext", "MaxText")
    )  # fmt: skip
    assert imports == []


def test_every_folder_sits_on_one_layer():
    """A folder is one job on one layer: a reader who knows where a package sits knows where each of its files does."""
    packages = {m for m, path in MODULES.items() if path.name == "__init__.py" and m != "maxtext_compat"}
    mixed = {p: sorted({layer_of(m) for m in MODULES if m == p or m.startswith(p + ".")}, key=str) for p in packages}
    assert not {p: layers for p, layers in mixed.items() if len(layers) != 1}


# Who may import the CPU stand-ins: the entry points that decide to install them, and the test kit.
CPU_USERS = ("doctor", "demo", "serve", "testing", "cpu")


def test_production_code_never_imports_the_cpu_stand_ins():
    """The kernel, the backport, the adapters, shims and serving reach no module of `maxtext_compat.cpu`, through any
    chain of imports: on a TPU nothing of the CPU emulation is loaded (the kernel enters an interpret-mode hook)."""
    importers = sorted(
        m.removeprefix("maxtext_compat.")
        for m, targets in GRAPH.items()
        if any(t.startswith("maxtext_compat.cpu") for t in targets)
    )
    assert [m for m in importers if m.split(".")[0] not in CPU_USERS] == []
    for start in ("kernel", "backport", "adapters", "shims", "serving", "serving_fixes", "decode", "convert"):
        reached: set[str] = set()
        todo = [m for m in MODULES if m == f"maxtext_compat.{start}" or m.startswith(f"maxtext_compat.{start}.")]
        while todo:
            for target in GRAPH[todo.pop()] - reached:
                reached.add(target)
                todo.append(target)
        assert not sorted(m for m in reached if m.startswith("maxtext_compat.cpu")), start


def drawn_table() -> str:
    """docs/architecture.md's layer table, drawn from LAYER_TABLE (a folder is written `name/`)."""
    rows = ["| layer | modules | job |", "|---|---|---|"]
    for index, (names, job) in enumerate(LAYER_TABLE):
        cells = ", ".join(f"`{n}/`" if (PACKAGE / n).is_dir() else f"`{n}`" for n in names)
        rows.append(f"| {index} | {cells} | {job} |")
    return "\n".join(rows)


def test_the_docs_draw_the_same_layers():
    """docs/architecture.md holds the table drawn from LAYER_TABLE, word for word: it cannot drift."""
    doc = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    table = drawn_table()
    assert table in doc, f"replace the layer table of docs/architecture.md with:\n{table}"
