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
