"""``load_properties`` reads text as ``java.util.Properties.load(Reader)`` does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactord.properties import load_properties


@pytest.mark.parametrize(
    "text",
    ["key=value", "key:value", "key value", "key\tvalue", "key = value", "key : value", "  key=value",
     "key   value", "key=  value"],
)
def test_separators(text: str) -> None:
    assert load_properties(text) == {"key": "value"}


@pytest.mark.parametrize(
    ("text", "value"),
    [("a==b", "=b"), ("a=:b", ":b"), ("a:=b", "=b"), ("a = = b", "= b"), ("a b=c", "b=c"), ("a=b=c", "b=c")],
)
def test_only_the_first_separator_counts(text: str, value: str) -> None:
    assert load_properties(text) == {"a": value}


@pytest.mark.parametrize("text", ["# a=b", "! a=b", "   # a=b", "\t! a=b", "#", "!"])
def test_comment_lines(text: str) -> None:
    assert load_properties(f"{text}\nx=1") == {"x": "1"}


def test_comment_character_inside_a_value_is_text() -> None:
    assert load_properties("a=b # not a comment") == {"a": "b # not a comment"}


def test_blank_lines_are_skipped() -> None:
    assert load_properties("\n\n   \n\t\na=1\n\n b=2 \n") == {"a": "1", "b": "2 "}


def test_trailing_white_space_of_a_value_is_kept() -> None:
    assert load_properties("a=b  ") == {"a": "b  "}


def test_line_continuation_strips_leading_white_space_of_the_next_line() -> None:
    assert load_properties("list=a,\\\n     b,\\\n\t c\nnext=1") == {"list": "a,b,c", "next": "1"}


def test_odd_number_of_trailing_backslashes_continues() -> None:
    # three backslashes: one escaped backslash, then the continuation
    assert load_properties("a=x\\\\\\\n  y") == {"a": "x\\y"}


@pytest.mark.parametrize("n", [2, 4])
def test_even_number_of_trailing_backslashes_does_not_continue(n: int) -> None:
    assert load_properties("a=x" + "\\" * n + "\nb=y") == {"a": "x" + "\\" * (n // 2), "b": "y"}


def test_continuation_at_end_of_text() -> None:
    assert load_properties("a=x\\") == {"a": "x"}


def test_continued_line_starting_with_hash_is_not_a_comment() -> None:
    assert load_properties("a=x\\\n  #y") == {"a": "x#y"}


def test_comment_line_ending_in_backslash_does_not_continue() -> None:
    assert load_properties("# comment \\\na=b") == {"a": "b"}


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_line_terminators(newline: str) -> None:
    text = newline.join(["a=1", "b=2\\", "  3", "# c", "d=4"])
    assert load_properties(text) == {"a": "1", "b": "23", "d": "4"}


@pytest.mark.parametrize(
    ("escaped", "char"),
    [("\\t", "\t"), ("\\n", "\n"), ("\\r", "\r"), ("\\f", "\f"), ("\\u00e9", "é"), ("\\u20AC", "€"),
     ("\\\\", "\\"), ("\\q", "q"), ("\\=", "="), ("\\:", ":"), ("\\ ", " "), ("\\#", "#")],
)
def test_escapes_in_values(escaped: str, char: str) -> None:
    assert load_properties(f"a=x{escaped}y") == {"a": f"x{char}y"}


def test_escaped_separators_and_spaces_inside_keys() -> None:
    assert load_properties("a\\=b\\:c\\ d=value") == {"a=b:c d": "value"}


def test_escapes_in_keys_are_decoded() -> None:
    assert load_properties("tab\\tkey\\u0041=1") == {"tab\tkeyA": "1"}


def test_leading_escaped_space_keeps_a_value_s_white_space() -> None:
    assert load_properties("a=\\  b") == {"a": "  b"}


def test_regex_backslashes_are_written_doubled() -> None:
    assert load_properties("pattern=^foo\\\\.bar$") == {"pattern": "^foo\\.bar$"}


def test_a_single_backslash_before_an_ordinary_character_is_dropped() -> None:
    # as in Java: this is why a regex's backslash must be doubled
    assert load_properties("pattern=^foo\\.bar$") == {"pattern": "^foo.bar$"}


def test_later_keys_replace_earlier_ones() -> None:
    assert load_properties("a=1\nb=2\na=3") == {"a": "3", "b": "2"}


@pytest.mark.parametrize("text", ["a=", "a:", "a", "a   ", "a =  "])
def test_empty_value_and_key_without_value(text: str) -> None:
    assert load_properties(text) == {"a": ""}


@pytest.mark.parametrize("text", ["a=\\u12", "a=\\u12zz", "a=x\\u"])
def test_malformed_unicode_escape_fails(text: str) -> None:
    with pytest.raises(ValueError, match="uxxxx"):
        load_properties(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("key\fvalue", {"key": "value"}), ("a=b\x85c", {"a": "b\x85c"}), ("a=b\x0bc", {"a": "b\x0bc"})],
)
def test_only_cr_and_lf_end_a_line(text: str, expected: dict[str, str]) -> None:
    assert load_properties(text) == expected


# -- round trip through a writer that escapes as java.util.Properties.store does --------------------


def _store_escape(text: str, *, key: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch in "\\=:#!":
            out.append("\\" + ch)
        elif ch == " ":
            out.append("\\ " if key or i == 0 else " ")
        elif ch in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[ch])
        elif not " " <= ch <= "~":
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


_TEXT = st.text(alphabet="ab=:#! \\\t\n\r\f\x85é€\u2028.$^", max_size=12)


@settings(database=None)
@given(st.dictionaries(_TEXT.filter(bool), _TEXT, max_size=5))
def test_stored_properties_read_back(props: dict[str, str]) -> None:
    text = "# written by a test\n" + "\n".join(
        f"{_store_escape(k, key=True)}={_store_escape(v, key=False)}" for k, v in props.items()
    )
    assert load_properties(text) == props
