"""The suite's own environment selection: a marker naming no matrix environment is an error, not a silent drop."""

from __future__ import annotations

import shutil

import pytest

from helpers.shipped import REPO

pytestmark = pytest.mark.envs("unit")  # tests the suite's own conftest in pytester: once per matrix run is enough

pytest_plugins = ["pytester"]


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    tests = pytester.mkdir("tests")
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    shutil.copy(REPO / "tests" / "environments.yaml", tests / "environments.yaml")  # the names markers may use
    shutil.copy(REPO / "compat_matrix.yaml", pytester.path / "compat_matrix.yaml")
    return pytester


def _write(p: pytest.Pytester, body: str) -> None:
    (p.path / "tests" / "test_x.py").write_text("import pytest\n" + body)


@pytest.mark.parametrize("marker", ["envs", "extended_in"])
def test_a_typo_in_a_marker_naming_environments_is_a_usage_error(suite, monkeypatch, marker):
    monkeypatch.setenv("MAXTEXT_COMPAT_ENV", "unit")
    _write(suite, f"@pytest.mark.{marker}('maxtext-0.2.55')\ndef test_a(): pass\n")
    res = suite.runpytest_subprocess("tests", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"*mark.{marker} names*maxtext-0.2.55*expected names from tests/environments.yaml*"])


def test_an_envs_marker_without_names_is_a_usage_error(suite, monkeypatch):
    monkeypatch.setenv("MAXTEXT_COMPAT_ENV", "unit")
    _write(suite, "@pytest.mark.envs()\ndef test_a(): pass\n")
    assert suite.runpytest_subprocess("tests", "-p", "no:cacheprovider").ret == pytest.ExitCode.USAGE_ERROR


def test_the_run_says_what_it_left_out(suite, monkeypatch):
    monkeypatch.delenv("MAXTEXT_COMPAT_ENV", raising=False)
    _write(
        suite,
        "@pytest.mark.envs('maxtext-0.2.5', 'maxtext-0.2.4')\ndef test_a(): pass\n"
        "@pytest.mark.envs('maxtext-0.2.5', 'maxtext-0.2.4')\ndef test_b(): pass\n"
        "def test_c(): pass\n",
    )
    res = suite.runpytest_subprocess("tests", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, deselected=2)
    res.stdout.fnmatch_lines(
        [
            "*in no matrix environment (MAXTEXT_COMPAT_ENV unset), deselected*",
            "*2  runs only in maxtext-0.2.5, maxtext-0.2.4",
        ]
    )


def test_the_heavy_phase_runs_last_serving_first_then_what_stays_large_each_module_whole(suite, monkeypatch):
    """The light modules as collected, then the serving modules, then RUN_LAST's, each module whole."""
    monkeypatch.delenv("MAXTEXT_COMPAT_ENV", raising=False)
    for name in ("test_real_gemma3", "test_convert_checkpoint", "test_serving_vllm", "test_b", "test_a"):
        (suite.path / "tests" / f"{name}.py").write_text("def test_1(): pass\ndef test_2(): pass\n")
    res = suite.runpytest_subprocess("tests", "-p", "no:cacheprovider", "--collect-only", "-q")
    files = [line.split("::")[0].rsplit("/", 1)[-1] for line in res.stdout.lines if "::" in line]
    heavy = ["test_serving_vllm.py"] * 2 + ["test_convert_checkpoint.py"] * 2 + ["test_real_gemma3.py"] * 2
    assert files == ["test_a.py"] * 2 + ["test_b.py"] * 2 + heavy, files


def test_the_first_heavy_test_takes_the_gate_and_light_ones_do_not(suite, monkeypatch, tmp_path):
    """In a gated run, the light module runs before the mark exists; the serving module's first test has the lock
    (another open of the file cannot take it) and the mark; the lock is free once the run has exited."""
    import fcntl
    import os

    from maxtext_compat.runner import memory as envmemory

    lock = tmp_path / "gate" / envmemory.SHARED_LOCK
    lock.parent.mkdir()
    mark = envmemory.heavy_mark(lock.parent, "maxtext-0.2.5")
    monkeypatch.setenv(envmemory.GATE_VAR, str(lock))
    monkeypatch.setenv(envmemory.MARK_VAR, str(mark))
    monkeypatch.setenv("MAXTEXT_COMPAT_ENV", "maxtext-0.2.5")
    probe = (
        "import fcntl, os, pytest\n"
        f"MARK, LOCK = {str(mark)!r}, {str(lock)!r}\n"
        "def held():\n"
        "    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT)\n"
        "    try:\n"
        "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "        return False\n"
        "    except BlockingIOError:\n"
        "        return True\n"
        "    finally:\n"
        "        os.close(fd)\n"
    )
    (suite.path / "tests" / "test_a.py").write_text(
        probe + "def test_light():\n    assert not os.path.exists(MARK) and not held()\n"
    )
    (suite.path / "tests" / "test_serving_vllm.py").write_text(
        probe + "def test_heavy():\n    assert os.path.exists(MARK) and held()\n"
    )
    res = suite.runpytest_subprocess("tests", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    assert envmemory.gate_waited(lock.parent, "maxtext-0.2.5") == pytest.approx(0.0, abs=0.5)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: the process that held it has exited
    finally:
        os.close(fd)


def _write_unit(p: pytest.Pytester) -> None:
    (p.path / "tests" / "unit").mkdir()
    (p.path / "tests" / "unit" / "test_u.py").write_text(
        "import pytest\n"
        "def test_plain(): pass\n"
        "@pytest.mark.every_env\ndef test_installed_matters(): pass\n"
        "@pytest.mark.envs('maxtext-0.2.5')\ndef test_named(): pass\n"
    )
    _write(p, "def test_compat(): pass\n")


@pytest.mark.parametrize(
    ("env", "passed", "deselected"),
    [
        ("maxtext-0.2.5", 3, 1),  # the plain unit test is left to the unit environment
        ("maxtext-0.2.1", 2, 2),  # ... and the marker naming 0.2.5 still rules
        ("unit", 3, 1),
        (None, 3, 1),  # outside the matrix: everything but what names an environment
    ],
)
def test_unit_tests_run_in_the_unit_environment_unless_marked_every_env(suite, monkeypatch, env, passed, deselected):
    if env is None:
        monkeypatch.delenv("MAXTEXT_COMPAT_ENV", raising=False)
    else:
        monkeypatch.setenv("MAXTEXT_COMPAT_ENV", env)
    _write_unit(suite)
    res = suite.runpytest_subprocess("tests", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=passed, deselected=deselected)
    if env == "maxtext-0.2.5":
        res.stdout.fnmatch_lines(["*1  a unit test: runs in the unit environment"])


@pytest.mark.parametrize(
    ("env", "extended", "passed", "deselected"),
    [
        ("maxtext-0.2.5", False, 1, 1),  # extended there: left to make test-extended
        ("maxtext-0.2.4", False, 2, 0),  # an ordinary test elsewhere
        ("maxtext-0.2.5", True, 1, 1),  # make test-extended's `-m extended` selects it there...
        ("maxtext-0.2.4", True, 0, 2),  # ... and not where make test already ran it
    ],
)
def test_extended_in_makes_a_test_extended_in_the_named_environments_only(
    suite, monkeypatch, env, extended, passed, deselected
):
    monkeypatch.setenv("MAXTEXT_COMPAT_ENV", env)
    if extended:
        monkeypatch.setenv("MAXTEXT_COMPAT_EXTENDED", "1")
    else:
        monkeypatch.delenv("MAXTEXT_COMPAT_EXTENDED", raising=False)
    _write(suite, "@pytest.mark.extended_in('maxtext-0.2.5')\ndef test_repeat(): pass\ndef test_plain(): pass\n")
    res = suite.runpytest_subprocess("tests", "-p", "no:cacheprovider", *(["-m", "extended"] if extended else []))
    res.assert_outcomes(passed=passed, deselected=deselected)


def _extended_envs(source: str) -> set[str]:
    """The environments a test module's extended tests may run in, read from its source: the names of every
    `extended_in(...)`, and, where a test is plainly `extended`, every name its module's `envs(...)` markers give
    (literal strings, or module-level names of a string or a tuple, passed as NAME or `*NAME`, bound in the module or
    imported from tests/helpers). More than exact, never less."""
    import ast
    import importlib

    tree = ast.parse(source)
    constants: dict[str, object] = {}
    imported: dict[str, tuple[str, str]] = {}  # name -> (helpers module, attribute): imported only if a marker uses it
    for n in tree.body:  # module-level names bound to literals, and names imported from tests/helpers
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple | ast.Constant):
            try:
                value = ast.literal_eval(n.value)
            except ValueError:
                continue
            constants.update({t.id: value for t in n.targets if isinstance(t, ast.Name)})
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("helpers"):
            imported.update({a.asname or a.name: (n.module or "", a.name) for a in n.names})
    calls: dict[str, list[ast.expr]] = {"envs": [], "extended_in": []}
    plain = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "extended" and ast.unparse(node.value) == "pytest.mark":
            plain = True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in calls
                and ast.unparse(node.func.value) == "pytest.mark"):  # fmt: skip
            calls[node.func.attr].extend(node.args)

    def value(name: str) -> object:
        if name in constants:
            return constants[name]
        module, attribute = imported[name]
        return getattr(importlib.import_module(module), attribute)

    def names(args: list[ast.expr]) -> set[str]:
        out: set[str] = set()
        for arg in args:
            if isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
                out |= set(value(arg.value.id))  # type: ignore[call-overload]
            elif isinstance(arg, ast.Name):
                out.add(str(value(arg.id)))
            else:
                out.add(ast.literal_eval(arg))
        return out

    return names(calls["extended_in"]) | (names(calls["envs"]) if plain else set())


def test_make_test_extended_runs_every_environment_an_extended_test_runs_in():
    """A test marked extended in an environment `make test-extended` does not list would never run anywhere (the
    data-parallel load run and the Ray mismatch did not, until this check)."""
    import re

    recipe = re.search(r"^test-extended:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), flags=re.M)
    assert recipe, "the Makefile has a test-extended target"
    commands = re.split(r"(?<!\\)\n", recipe.group(1))  # one per recipe line, continuations joined
    extended = [c for c in commands if "-m extended" in c]
    assert len(extended) == 1, commands
    listed = set(re.findall(r"\b(maxtext-[\w.-]+|tpu-inference-[\w.-]+)", extended[0]))
    needed = {}
    for path in sorted((REPO / "tests" / "compat").glob("test_*.py")):
        for env in _extended_envs(path.read_text(encoding="utf-8")):
            needed.setdefault(env, []).append(path.name)
    assert needed and listed, (needed, listed)
    missing = {env: files for env, files in needed.items() if env not in listed}
    assert not missing, f"make test-extended does not run {missing}: add them to its environment list"


def test_the_extended_reader_sees_each_way_a_module_names_environments():
    source = (
        "import pytest\nALL = ('maxtext-0.2.4', 'maxtext-0.2.0')\n"
        "pytestmark = [pytest.mark.envs(*ALL), pytest.mark.extended_in('maxtext-0.1.0')]\n"
        "@pytest.mark.envs('maxtext-0.2.2')\n@pytest.mark.extended\ndef test_a(): pass\n"
    )
    assert _extended_envs(source) == {"maxtext-0.2.4", "maxtext-0.2.0", "maxtext-0.1.0", "maxtext-0.2.2"}
    assert _extended_envs(source.replace("@pytest.mark.extended\n", "")) == {"maxtext-0.1.0"}


def test_an_environment_marked_extended_is_left_out_of_a_plain_run_by_name_and_make_test_extended_runs_it():
    """`extended: true` in tests/environments.yaml: a plain `matrix` run (make test) leaves it out and says which; with
    MAXTEXT_COMPAT_EXTENDED=1 or named it runs; make test-extended names each in a line that runs it whole."""
    import re

    from maxtext_compat.matrix import load_matrix, with_environments
    from maxtext_compat.runner.running import EXTENDED_VAR, plain_run

    m = with_environments(load_matrix(REPO / "compat_matrix.yaml"), REPO / "tests" / "environments.yaml")
    marked = [name for name, spec in m.environments.items() if spec.extended]
    assert marked, "no environment is marked extended: this test would hold nothing"
    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(EXTENDED_VAR, raising=False)
        plain = plain_run(m, said.append)
        mp.setenv(EXTENDED_VAR, "1")
        every = plain_run(m, said.append)
    assert plain == [n for n in m.environments if n not in marked] and every == list(m.environments)
    assert len(said) == 1 and all(name in said[0] for name in marked) and EXTENDED_VAR in said[0]
    recipe = re.search(r"^test-extended:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), flags=re.M)
    assert recipe
    whole = [c for c in re.split(r"(?<!\\)\n", recipe.group(1)) if "-m extended" not in c and "-k" not in c]
    for name in marked:
        assert any(re.search(rf"\b{re.escape(name)}\b", c) and f"{EXTENDED_VAR}=1" in c for c in whole), name
