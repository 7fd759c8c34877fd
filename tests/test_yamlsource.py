"""YAML with positions: aliases, merge keys, interpolation and hostile input.

Every bad input is a ManifestError naming file, line, column and key path, what
was expected and what was found; never a Python traceback, and never slow.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgebuild.errors import ManifestError
from edgebuild.core.yamlsource import MAX_DEPTH, load_yaml

INTERPOLATION_FORMS = "expected ${NAME} or ${NAME:-default} ('$$' for a literal '$')"
RECURSIVE = "is inside the node it refers to; expected it outside that node (recursive aliases are not supported)"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> object:
    value, _ = load_yaml(write(tmp_path, text), environ or {})
    return value


def error_of(path: Path, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ManifestError) as caught:
        load_yaml(path, environ or {})
    return str(caught.value)


# --- aliases and merge keys ------------------------------------------------------


def test_alias_is_a_copy_and_points_at_the_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "base: &base {size: 448}\nuses:\n  - *base\n  - *base\n")
    value, source = load_yaml(path, {})
    assert value == {"base": {"size": 448}, "uses": [{"size": 448}, {"size": 448}]}
    assert value["uses"][0] is not value["uses"][1]
    assert source.where(("uses", 1)) == f"{path}:4:5"
    # Inside the copy, positions are where the anchored node wrote them.
    assert source.where(("uses", 1, "size")) == f"{path}:1:14"


ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi")
)


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """9 levels of 9 aliases: 9**9 strings if copied in full. The limit stops it at
    the fifth level, pointing at the alias of the document's own tree."""
    path = write(tmp_path, ALIAS_BOMB)
    started = time.perf_counter()
    message = error_of(path)
    # Minutes before the bound; the margin absorbs a loaded machine.
    assert time.perf_counter() - started < 5.0
    assert message == (
        f"{path}:5:23: e -> 5: aliases and merge keys copy more than 50000 values (each use counted in full); "
        "expected at most 50000 copied values"
    )


def test_thousands_of_plain_values_are_not_an_alias_bomb(tmp_path: Path) -> None:
    """5,000 artifacts written out plainly hold 20,000 values: the file's size bounds
    them, and the alias cap counts copies only."""
    text = "artifacts:\n" + "".join(
        f"  a{index}: {{kind: hf_onnx, checkpoint: m, opset: 17}}\n" for index in range(5000)
    )
    path = write(tmp_path, text)
    data, _ = load_yaml(path)
    assert len(data["artifacts"]) == 5000


def test_merge_key_bomb_is_refused_quickly(tmp_path: Path) -> None:
    text = "a: &a {k0: 1, k1: 2}\n" + "".join(
        f"{name}: &{name} {{{', '.join(f'x{index}: {{<<: *{previous}}}' for index in range(9))}}}\n"
        for previous, name in zip("abcdefgh", "bcdefghi")
    )
    path = write(tmp_path, text)
    started = time.perf_counter()
    message = error_of(path)
    # Minutes before the bound; the margin absorbs a loaded machine.
    assert time.perf_counter() - started < 5.0
    assert message == (
        f"{path}:6:27: f -> x1 -> x2: aliases and merge keys copy more than 50000 values (each use counted in full); "
        "expected at most 50000 copied values"
    )


def test_recursive_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "a: &a [*a]\n")
    assert error_of(path) == f"{path}:1:8: a -> 0: alias *a {RECURSIVE}"
    path = write(tmp_path, "a: &a {x: [1, *a]}\n")
    assert error_of(path) == f"{path}:1:15: a -> x -> 1: alias *a {RECURSIVE}"


def test_recursive_merge(tmp_path: Path) -> None:
    path = write(tmp_path, "a: &a {<<: *a}\n")
    assert error_of(path) == f"{path}:1:12: a -> <<: alias *a {RECURSIVE}"
    path = write(tmp_path, "a: &a {x: {<<: *a}}\n")
    assert error_of(path) == f"{path}:1:16: a -> x -> <<: alias *a {RECURSIVE}"


def test_merge_keys(tmp_path: Path) -> None:
    """The YAML merge-key type: written keys win over merged ones; in a list, an
    earlier mapping wins over a later one (PyYAML 6.0.4's SafeLoader lets the later
    one win for keys of two or more characters, pyyaml issue #953)."""
    value = load(
        tmp_path,
        "first: &first {shared: 1, only_first: 1}\n"
        "second: &second {shared: 2, only_second: 2}\n"
        "nested: &nested {<<: *first, own: 3}\n"
        "both: {<<: [*first, *second], own: 0}\n"
        "override: {<<: *nested, own: 4, shared: 5}\n"
        "inline: {<<: {deep: {x: 1}}}\n",
    )
    assert value["both"] == {"shared": 1, "only_first": 1, "only_second": 2, "own": 0}
    assert value["nested"] == {"shared": 1, "only_first": 1, "own": 3}
    assert value["override"] == {"shared": 5, "only_first": 1, "own": 4}
    assert value["inline"] == {"deep": {"x": 1}}


def test_merged_value_points_at_where_it_was_written(tmp_path: Path) -> None:
    path = write(tmp_path, "base: &base\n  size: 448\nuse:\n  <<: *base\n")
    _, source = load_yaml(path, {})
    assert source.where(("use", "size")) == f"{path}:2:3"


def test_merge_of_a_non_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "a: {<<: 1}\n")
    assert error_of(path) == f"{path}:1:9: a -> <<: expected a mapping or a list of mappings to merge, found an integer"
    path = write(tmp_path, "m: &m {x: 1}\na: {<<: [*m, [1]]}\n")
    assert error_of(path) == f"{path}:2:14: a -> <<: expected a mapping or a list of mappings to merge, found a list"


def test_repeated_merge_key_is_a_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, "m: &m {x: 1}\na:\n  <<: *m\n  <<: *m\n")
    assert error_of(path) == f"{path}:4:3: a -> <<: duplicate key (first defined on line 3)"


def test_merge_key_as_a_value(tmp_path: Path) -> None:
    path = write(tmp_path, "a: <<\n")
    assert error_of(path) == f"{path}:1:4: a: found a merge key '<<'; expected a string, number, boolean or null"


# --- nesting -----------------------------------------------------------------------


def test_deep_nesting(tmp_path: Path) -> None:
    """The composer recurses once per level: without a bound, deep input is a RecursionError."""
    path = write(tmp_path, "x: " + "[" * 1000 + "]" * 1000 + "\n")
    assert error_of(path) == (
        f"{path}:1:{3 + MAX_DEPTH + 1}: x -> " + " -> ".join(["0"] * MAX_DEPTH)
        + f": nested more than {MAX_DEPTH} levels deep; expected at most {MAX_DEPTH}"
    )


def test_deep_nesting_through_aliases(tmp_path: Path) -> None:
    path = write(tmp_path, "a: &a " + "[" * 40 + "1" + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n")
    assert error_of(path) == (
        f"{path}:2:34: b -> " + " -> ".join(["0"] * 30)
        + f": nested more than {MAX_DEPTH} levels deep once aliases are copied; expected at most {MAX_DEPTH}"
    )


# --- interpolation -----------------------------------------------------------------


def test_whole_interpolated_scalar_is_typed_like_a_written_one(tmp_path: Path) -> None:
    value = load(
        tmp_path,
        "size: ${SIZE:-448}\n"
        "ratio: ${RATIO:-0.5}\n"
        "flag: ${FLAG:-true}\n"
        "nothing: ${NOTHING:-}\n"
        "from_environment: ${OPSET}\n"
        "quoted: '${SIZE:-448}'\n"
        "tagged: !!str ${SIZE:-448}\n"
        "in_text: v${SIZE:-448}\n"
        "list_text: ${LIST}\n",
        environ={"OPSET": "20", "LIST": "[1, 2]"},
    )
    assert value == {
        "size": 448,
        "ratio": 0.5,
        "flag": True,
        "nothing": None,
        "from_environment": 20,
        "quoted": "448",
        "tagged": "448",
        "in_text": "v448",
        # Only ever a scalar: the environment cannot inject a list.
        "list_text": "[1, 2]",
    }


def test_interpolated_scalar_is_checked_like_a_written_one(tmp_path: Path) -> None:
    path = write(tmp_path, "when: ${WHEN:-2024-01-01}\n")
    assert error_of(path) == (
        f"{path}:1:7: when: found a date '2024-01-01'; expected a string, number, boolean or null "
        "(quote it to make it a string)"
    )


def test_dollar_escapes(tmp_path: Path) -> None:
    value = load(tmp_path, "a: $${A}\nb: cost $5 $HOME $\nc: ${A:-a$$b}\nd: $$${A:-1}\n")
    assert value == {"a": "${A}", "b": "cost $5 $HOME $", "c": "a$b", "d": "$1"}


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("${A:-${B}}", "a default cannot contain '${' (nesting is not supported)"),
        ("${A-d}", "only ':-default' may follow the variable name, found '-d'"),
        ("${A:?err}", "only ':-default' may follow the variable name, found ':?err'"),
        ("${HOME", "'${' is not closed by '}'"),
        ("x ${}", "'${}' names no variable"),
        ("${1A}", "'1A' is not a variable name (letters, digits and '_', not starting with a digit)"),
        ("${A.B}", "only ':-default' may follow the variable name, found '.B'"),
    ],
)
def test_malformed_interpolation(tmp_path: Path, written: str, problem: str) -> None:
    path = write(tmp_path, f"checkpoints:\n  q:\n    path: {written}\n")
    assert error_of(path, {"A": "a", "B": "b", "HOME": "/home"}) == (
        f"{path}:3:11: checkpoints -> q -> path: bad ${{...}} in {written!r}: {problem}; {INTERPOLATION_FORMS}"
    )


def test_empty_variable_without_default(tmp_path: Path) -> None:
    path = write(tmp_path, "a: ${EMPTY}\n")
    assert error_of(path, {"EMPTY": ""}) == (
        f"{path}:1:4: a: environment variable EMPTY is empty (write ${{EMPTY:-default}} to give a default)"
    )


# --- scalars -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "found"),
    [
        ("2024-02-30", "found a date '2024-02-30'; expected a string, number, boolean or null "
         "(quote it to make it a string)"),
        ("!!binary aGVsbG8=", "found binary data 'aGVsbG8='; expected a string, number, boolean or null"),
        ("!custom x", "found a value tagged !custom 'x'; expected a string, number, boolean or null"),
        ("!!set {x, y}", "found a mapping tagged !!set; expected an untagged one"),
        ("!!bool maybe", "expected a boolean, found 'maybe'"),
        ("!!int twelve", "expected an integer, found 'twelve'"),
    ],
)
def test_values_are_plain_data(tmp_path: Path, written: str, found: str) -> None:
    path = write(tmp_path, f"a: {written}\n")
    assert error_of(path) == f"{path}:1:4: a: {found}"


def test_huge_integers_are_kept_exactly(tmp_path: Path) -> None:
    value = load(tmp_path, "opset: 100000000000000000000000\nimage_size: 100000000000000000000000000000000\n")
    assert value == {"opset": 10**23, "image_size": 10**32}
    assert load(tmp_path, f"a: {'9' * 100}\n") == {"a": 10**100 - 1}


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("1" * 101, f"{'1' * 40!r}... (101 characters)"),
        # More digits than Python's int() converts by default (4300).
        ("1" * 5000, f"{'1' * 40!r}... (5000 characters)"),
        ("0x" + "f" * 90, f"{'0x' + 'f' * 38!r}... (92 characters)"),
    ],
)
def test_integer_digit_limit(tmp_path: Path, written: str, shown: str) -> None:
    path = write(tmp_path, f"a:\n  b: {written}\n")
    assert error_of(path) == (
        f"{path}:2:6: a -> b: found an integer of more than 100 digits, {shown}; expected at most 100 digits"
    )


def test_keys_are_strings_numbers_or_booleans(tmp_path: Path) -> None:
    path = write(tmp_path, "a:\n  ? [1]\n  : x\n")
    assert error_of(path) == f"{path}:2:5: a: expected a string, number or boolean as a key, found a list"
    path = write(tmp_path, "a:\n  ~: x\n")
    assert error_of(path) == f"{path}:2:3: a: expected a string, number or boolean as a key, found null"


# --- the file ----------------------------------------------------------------------


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "doc.yaml"
    # The column counts characters: the é before the bad byte is two bytes.
    path.write_bytes(b"a: 1\nname: caf\xc3\xa9 \xff\n")
    assert error_of(path) == (
        f"{path}:2:12: invalid UTF-8 at byte 17 (0xff: invalid start byte); expected a UTF-8 text file"
    )


def test_unprintable_character(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\nb: x\x07\n")
    assert error_of(path) == f"{path}:2:5: invalid YAML: found the unprintable character #x0007; expected printable text"


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_empty_document(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path) == f"{path}:1:1: (top level): expected a mapping, found an empty manifest"


def test_invalid_yaml_says_what_the_problem_is_about(tmp_path: Path) -> None:
    path = write(tmp_path, "a: &x 1\nb: &x 2\n")
    assert error_of(path) == (
        f"{path}:2:4: invalid YAML: second occurrence (found duplicate anchor 'x'; first occurrence on line 1)"
    )
