"""Which chat template a conversion writes (maxtext_compat.convert.chat_template): the user's file, else the source's
own, else the family's packaged one (Gemma 3), else none, said in a line each time; a bad template file is a typed
error naming `chat_template`. The packaged Gemma 3 text is held equal to MaxText's own file in
tests/compat/test_real_gemma3.py (where MaxText ships it)."""

from __future__ import annotations

import json

import pytest

from maxtext_compat.convert.chat_template import choose, family_template, given_template, read_template_file
from maxtext_compat.errors import InvalidArgumentError

pytestmark = pytest.mark.envs("maxtext-0.2.3")  # plain Python and jinja2 (vLLM's); one environment is enough
TURNS = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"


def test_the_users_template_wins_over_the_files_and_the_family(tmp_path):
    given = tmp_path / "mine.jinja"
    given.write_text(TURNS, encoding="utf-8")
    got = choose(given=given_template(given), in_file="{{ 'the file' }}", architecture="gemma3")
    assert (got.text, got.source) == (TURNS, "argument")
    assert str(given) in got.note and "in place of the source's own" in got.note


def test_the_files_own_template_wins_over_the_family():
    got = choose(given=None, in_file="{{ 'the file' }}", architecture="gemma3")
    assert (got.text, got.source) == ("{{ 'the file' }}", "file")


def test_a_gemma3_file_without_one_gets_gemma3s_template_and_says_where_from():
    got = choose(given=None, in_file=None, architecture="gemma3")
    assert got.source == "family" and got.text == family_template("gemma3")
    assert got.text.startswith("{{ bos_token }}") and "<start_of_turn>" in got.text and "<end_of_turn>" in got.text
    assert "gemma-3-27b-chat_template.json" in got.note and "carries none" in got.note


@pytest.mark.parametrize("architecture", ["llama", None, "gemma2"])
def test_a_family_without_a_packaged_template_gets_none_and_the_note_says_how_to_add_one(architecture):
    got = choose(given=None, in_file=None, architecture=architecture)
    assert (got.text, got.source) == (None, "none") and "--chat-template" in got.note
    assert family_template(architecture) is None


def test_a_json_file_gives_its_chat_template_string(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": TURNS, "bos_token": "<s>"}), encoding="utf-8")
    assert read_template_file(path) == TURNS


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("t.json", json.dumps({"bos_token": "<s>"}), 'no "chat_template" string'),
        ("t.json", json.dumps({"chat_template": 3}), 'no "chat_template" string'),
        ("t.json", "[1, 2]", 'no "chat_template" string'),
        ("t.json", "{not json", 'no "chat_template" string'),
        ("t.jinja", "  \n", "empty"),
        ("t.jinja", b"\xff\xfe{{", "cannot be read"),
    ],
)
def test_a_bad_template_file_is_a_typed_error_naming_the_argument(tmp_path, name, content, says):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InvalidArgumentError) as err:
        given_template(path)
    assert err.value.argument == "chat_template" and says in str(err.value) and err.value.fix


def test_a_missing_template_file_is_a_typed_error(tmp_path):
    with pytest.raises(InvalidArgumentError) as err:
        read_template_file(tmp_path / "absent.jinja")
    assert err.value.argument == "chat_template" and "absent.jinja" in str(err.value.found)


def test_a_template_jinja2_cannot_parse_is_a_typed_error_with_its_line(tmp_path):
    path = tmp_path / "broken.jinja"
    path.write_text("{% for m in messages %}\n{{ m['content'] }", encoding="utf-8")
    with pytest.raises(InvalidArgumentError) as err:
        read_template_file(path)
    assert err.value.argument == "chat_template" and "line 2" in str(err.value.found)


def test_gemma3s_packaged_template_renders_googles_turn_format():
    """The oracle is the turn format written out by hand (Google's Gemma 3 prompt-formatting guide): a system
    message joins the first user turn, the assistant's role is `model`, each turn ends with <end_of_turn>."""
    import jinja2

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Capital of France?"}]  # fmt: skip
    text = (
        jinja2.Environment()
        .from_string(family_template("gemma3"))
        .render(messages=messages, bos_token="<bos>", add_generation_prompt=True)
    )
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                    "<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n")  # fmt: skip
