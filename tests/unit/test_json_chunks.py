"""potato.annotations.json_chunks: the fast user_state reader must read exactly what json.loads reads, or give up."""

from __future__ import annotations

import json

import pytest

from potato.annotations.json_chunks import GiveUp, member_batches

KEY = "instance_id_to_label_to_value"

# Strings that look like member boundaries of every format, inside values and keys.
_TRICKY = ['}, "x": [1', '], "', ',\n    "', "a\\\"b", "naïve ✓", "", "]]", "{"]


def _state(n: int) -> dict:
    labels = {}
    for i in range(n):
        tricky = _TRICKY[i % len(_TRICKY)]
        if i % 3 == 0:
            labels[f"r{i}"] = [[{"schema": "sentiment", "name": "positive"}, "positive"]]
        elif i % 3 == 1:
            labels[f"r{i}{tricky}"] = {"sentiment": {"negative": "true"}, "topic": {tricky: True}}
        else:
            labels[f"r{i}"] = [[{"schema": "topic", "name": tricky}, tricky], [{"schema": "s", "name": "n"}, 1.5]]
    return {
        "user_id": "alice",
        "instance_id_ordering": [f"r{i}" for i in range(n)],
        "current_instance_index": 3,
        "completed_phase_and_pages": [["consent", "consent"]],
        KEY: labels,
        "instance_id_to_span_to_value": {"r1": {"a": [1, 2, {"b": None}]}},
        "training_state": {"passed": False, "nested": [[[]], {}]},
    }


def _read(path, window):
    return [(key, values[text]) for keys, texts, values in member_batches(path, KEY, window=window)
            for key, text in zip(keys, texts)]


@pytest.mark.parametrize("dump", [
    lambda d: json.dumps(d, indent=2),
    lambda d: json.dumps(d),
    lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False),
    lambda d: json.dumps(d, indent="\t"),
    lambda d: "\n " + json.dumps(d, indent=1) + "\r\n",
], ids=["indent2", "default", "compact", "tabs", "indent1-padded"])
@pytest.mark.parametrize("window", [16, 100, 1 << 20])
def test_chunks_read_what_json_loads_reads(tmp_path, dump, window):
    state = _state(40)
    path = tmp_path / "user_state.json"
    path.write_text(dump(state), encoding="utf-8")
    assert _read(path, window) == list(state[KEY].items())


@pytest.mark.parametrize("text", ['{"a": 1}', '{"%s": null}' % KEY, '{"%s": {}}' % KEY, "{}"])
def test_no_labels_yields_nothing(tmp_path, text):
    path = tmp_path / "s.json"
    path.write_text(text)
    assert _read(path, 16) == []


@pytest.mark.parametrize("text", [
    "",
    "[1, 2]",
    '{"%s": [1, 2]}' % KEY,
    '{"user_id": "x", "%s": {"r1": [}' % KEY,
    '{"%s": {"r1": [1]}} {}' % KEY,
    '{"%s": {"r1": [1]}' % KEY,
    '\ufeff{"%s": {}}' % KEY,
    '{"%s": {"r1": NaN}}' % KEY,
])
def test_anything_odd_gives_up(tmp_path, text):
    path = tmp_path / "s.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(GiveUp):
        _read(path, 16)


def test_invalid_utf8_gives_up(tmp_path):
    path = tmp_path / "s.json"
    path.write_bytes(b'{"%s": {"r\xff": 1}}' % KEY.encode())
    with pytest.raises(GiveUp):
        _read(path, 1 << 20)


# Layouts where the member separator (',' + the first member's indentation + '"')
# also occurs where no member starts: the split must not be believed there.
_FOOLING = [
    '{"%s": {\n    "r1": [\n    "x",\n    "y"],\n    "r2": 1\n}}' % KEY,  # an array as indented as the members
    '{"%s": {\n    "r1": {\n    "a": 1,\n    "b": 2},\n    "r2": 1\n}}' % KEY,  # an object too
    '{"%s": {\n    "r1": "a,\\n    \\"b",\n    "r2": 1\n}}' % KEY,  # a string that reads like one when unescaped
    '{"%s": {\n    "r\\"1": 1,\n    "r\\u00e92": 2,\n    "r3" : 3,\n    "r4":4\n}}' % KEY,  # keys with escapes, odd spacing
    '{"%s": {\n    "r1": 1,\n    "r2": 2\n  },\n  "other": {\n    "r9": 9,\n    "r8": 8\n  }\n}' % KEY,  # same layout after it
    '{"%s": {\r\n    "r1": [1,\r\n    2],\r\n    "r2": 2\r\n}}' % KEY,  # CRLF
    '{"%s": {\n    "r1": {\n"a": 1\n},\n    "r2": 1\n  },\n  "x": {\n    "y": 1,\n    "z": 2\n  }\n}' % KEY,  # a '}' less indented inside
]


@pytest.mark.parametrize("text", _FOOLING)
@pytest.mark.parametrize("window", [8, 16, 64, 1 << 20])
def test_a_split_that_does_not_hold_is_not_believed(tmp_path, text, window):
    path = tmp_path / "s.json"
    path.write_text(text, encoding="utf-8")
    assert _read(path, window) == list(json.loads(text)[KEY].items())


def test_potatos_own_layout_is_split_not_parsed_whole(tmp_path):
    # A split batch's texts are the file's own value texts (with their indentation),
    # each distinct one parsed once; a parsed chunk's would be orjson's compact ones.
    state = {"user_id": "u", KEY: {f"r{i}": [[{"schema": "s", "name": "ab"[i % 2]}, "ab"[i % 2]]] for i in range(500)}}
    path = tmp_path / "user_state.json"
    whole = json.dumps(state, indent=2)  # then more members laid out the same way, as in Potato's file
    path.write_text(whole[:-2] + ',\n  "training_state": {\n    "passed": false,\n    "failed": false\n  }\n}')
    batches = list(member_batches(path, KEY, window=2048))
    assert len(batches) > 5
    for keys, texts, values in batches:  # the last one too, though separators follow the object's end
        assert all(value_text.startswith(b" [\n      [\n") for value_text in texts)
        assert len(values) == 2
    assert _read(path, 2048) == list(state[KEY].items())
