"""One member of a data file's record set or removed, every other byte kept (potato.json_records)."""

from __future__ import annotations

import json

import orjson
import pytest

from potato.json_records import EditError, Record, ascii_json, ascii_safe, members, records, set_member, starts_array

PREDICTION = {"sentiment": {"label": "négatif\u2028", "confidence": 0.5, "run_id": 3}}

# What a JSON round trip would rewrite, each in a record of its own.
HOSTILE_LINES = [
    '{"id": "a", "text": "caf\u00e9 \\u2028 \\ud83d lone", "n": 1e5, "m": 1.0, "z": -0.0}',
    '{"text":"b first","id":"b","nested":{"predictions":"not ours","x":[1,{"y":"}"}]}}',
    '{ "id" : "c" ,  "text" : "spaced \\"quotes\\" and \\\\ back" }',
    '{"id": 4, "text": "a number id", "predictions": {"old": 1}}',
    '{"id":"e","text":"😀 emoji","big":123456789012345678901234567890,"nan":NaN}',
]


def _file(lines, newline="\r\n", bom=True) -> bytes:
    return ("\ufeff" if bom else "").encode() + newline.join(lines).encode("utf-8") + newline.encode()


def _edit_all(data: bytes, field: str, value, encoding="utf-8") -> bytes:
    pieces, pos = [], 0
    for record in records(data, array=starts_array(data), encoding=encoding):
        pieces += [data[pos:record.start], set_member(data, record, field, value, encoding)]
        pos = record.end
    return b"".join(pieces + [data[pos:]])


def test_records_of_a_json_lines_file_with_a_bom_and_crlf():
    data = _file(HOSTILE_LINES)
    found = list(records(data, array=False))
    assert [r.value.get("id") for r in found] == ["a", "b", "c", 4, "e"]
    assert [data[r.start:r.end].decode() for r in found] == HOSTILE_LINES
    assert found[0].value["text"] == "café \u2028 \ud83d lone"  # escapes read as JSON reads them


def test_setting_then_removing_a_member_gives_back_every_byte():
    data = _file(HOSTILE_LINES)
    added = _edit_all(data, "predictions", PREDICTION)
    for before, after in zip(records(data, array=False), records(added, array=False)):
        expected = {k: v for k, v in before.value.items() if k != "predictions"} | {"predictions": PREDICTION}
        assert json.dumps(after.value, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert added.startswith(b"\xef\xbb\xbf") and added.count(b"\r\n") == len(HOSTILE_LINES)
    assert b"1e5" in added and b"1.0" in added and b"\\u2028 \\ud83d" in added
    assert "\u2028".encode() not in added  # never raw: 2.12 splits lines at it
    removed = _edit_all(added, "predictions", None)
    # Every record that did not hold the field before is its own bytes again; "d" held one (replaced in place).
    expected = _file(HOSTILE_LINES[:3] + ['{"id": 4, "text": "a number id"}'] + HOSTILE_LINES[4:])
    assert removed == expected


def test_an_existing_member_keeps_its_place_and_a_new_one_follows_the_records_spelling():
    compact = b'{"id":"a","text":"t"}'
    spaced = b'{"id": "a", "text": "t"}'
    record = next(records(compact, array=False))
    assert set_member(compact, record, "p", 1) == b'{"id":"a","text":"t","p":1}'
    record = next(records(spaced, array=False))
    assert set_member(spaced, record, "p", 1) == b'{"id": "a", "text": "t", "p": 1}'
    first = b'{"p": {"x": 1}, "id": "a"}'
    record = next(records(first, array=False))
    assert set_member(first, record, "p", [2]) == b'{"p": [2], "id": "a"}'
    assert set_member(first, record, "p", None) == b'{"id": "a"}'


def test_a_pretty_printed_array_keeps_its_indentation():
    data = b'[\n  {\n    "id": "a",\n    "text": "x"\n  },\n  "not an item",\n  {"id": "b"}\n]\n'
    assert starts_array(data)
    assert [r.value for r in records(data, array=True)] == [{"id": "a", "text": "x"}, {"id": "b"}]
    added = _edit_all(data, "p", {"s": 1})
    assert added == (b'[\n  {\n    "id": "a",\n    "text": "x",\n    "p": {"s": 1}\n  },\n  "not an item",\n'
                     b'  {"id": "b", "p": {"s": 1}}\n]\n')
    assert _edit_all(added, "p", None) == data


def test_a_json_lines_line_holding_an_array_holds_records_too():
    data = b'{"id": "c"}\n[{"id": "a"}, 3, {"id": "b", "x": {"id": "inner"}}]\n'
    assert not starts_array(data)
    assert [r.value["id"] for r in records(data, array=False)] == ["c", "a", "b"]
    # A file that opens with "[" is one array to Potato 2.12, which then reads none of a JSON-lines file.
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        list(records(b'[{"id": "a"}]\n{"id": "c"}\n', array=True))


def test_a_line_that_is_not_json_is_named():
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        list(records(b'{"id": "a"}\n{"id": \n', array=False))


def test_a_repeated_key_is_edited_where_a_parser_reads_it_and_refused_where_it_cannot_be_removed():
    data = b'{"id": "a", "p": 1, "p": 2}'
    record = next(records(data, array=False))
    assert record.value == {"id": "a", "p": 2}
    assert set_member(data, record, "p", 3) == b'{"id": "a", "p": 1, "p": 3}'
    with pytest.raises(EditError):  # the first "p" would be read once the last is gone
        set_member(data, record, "p", None)


def test_members_are_found_past_strings_that_look_like_structure():
    data = b'{"a": "}{,:\\"", "b": [1, "]", {"c": "}"}], "d": null}'
    record = Record(0, len(data), orjson.loads(data))
    assert [(m.key, data[m.value_start:m.value_end]) for m in members(data, record)] == [
        ("a", b'"}{,:\\""'), ("b", b'[1, "]", {"c": "}"}]'), ("d", b"null")]


def test_a_one_byte_encoding_is_edited_in_its_bytes():
    data = '{"id": "é1", "text": "Zoë"}\n'.encode("latin-1")
    added = _edit_all(data, "p", {"s": "ë"}, encoding="iso8859-1")
    assert added == b'{"id": "\xe91", "text": "Zo\xeb", "p": {"s": "\\u00eb"}}\n'
    assert [r.value for r in records(added, array=False, encoding="iso8859-1")] == [
        {"id": "é1", "text": "Zoë", "p": {"s": "ë"}}]


@pytest.mark.parametrize("encoding, safe", [("utf-8", True), ("latin-1", True), ("cp1252", True),
                                            ("koi8-r", True), ("shift_jis", False), ("gbk", False),
                                            ("utf-16", False), ("big5", False)])
def test_only_encodings_whose_ascii_bytes_are_always_ascii_are_edited(encoding, safe):
    assert ascii_safe(encoding) is safe


def test_ascii_json_escapes_what_a_line_splitter_would_cut():
    assert ascii_json({"t": "a\u2028b\x85c\ud83d"}) == b'{"t": "a\\u2028b\\u0085c\\ud83d"}'
