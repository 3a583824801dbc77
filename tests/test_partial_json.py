"""partial_object: the object a cut JSON text holds so far, read as Anthropic's SDK reads a streamed
tool input (jiter's partial mode, the SDK's own dependency, is the reference)."""
from __future__ import annotations

import json
import random

import jiter

from llambda.server.partial_json import partial_object

DOCS = [
    {"city": 'Pa"ris \\ é', "n": [1, 2.5, -3e2, {"x": None, "y": True, "z": False}], "o": {}, "l": [],
     "u": "\u2603\n\t", "deep": [[[{"k": [0, -0.25]}]]]},
    {"a": 12345678901234567890, "b": "x" * 40, "c": [True, False, None]},
]


def test_every_prefix_reads_as_the_sdk_reads_a_streamed_input():
    for doc in DOCS:
        for indent, ascii_only in ((None, False), (2, True), (None, True)):
            text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only)
            for k in range(len(text) + 1):
                want = jiter.from_json(text[:k].encode(), partial_mode=True) if k else {}
                assert partial_object(text[:k]) == want, text[:k]
            assert partial_object(text) == doc


def test_unfinished_scalars_are_left_out_and_containers_kept():
    assert partial_object('{"city": "Ro') == {}
    assert partial_object('{"city": "Rome", "unit": "cel') == {"city": "Rome"}
    assert partial_object('{"a": 1.') == {} and partial_object('{"a": 12') == {"a": 12}
    assert partial_object('{"a": [1, {"b": tr') == {"a": [1, {}]}
    assert partial_object('{"a": nul') == {} and partial_object('{"a": true') == {"a": True}


def test_what_is_no_object_is_an_empty_one():
    for text in ("", "   ", "[1, 2]", '"text"', "42", "nonsense", "{oops}", '{"a" 1}', "}{"):
        assert partial_object(text) == {}, text
    # text that stops being JSON ends the object there
    assert partial_object('{"a": 1, "b": oops, "c": 2}') == {"a": 1}
    assert partial_object('{"a": 1} trailing') == {"a": 1}


def test_deep_nesting_is_cut_not_a_crash():
    for text in ('{"a": ' + "[" * 100_000, '{"a": ' + "[" * 5000 + "]" * 5000 + "}"):
        got = partial_object(text)
        assert list(got) == ["a"] and isinstance(got["a"], list)


def test_random_garbage_never_raises():
    rng = random.Random(7)
    parts = ['{', '}', '[', ']', '"', '\\', ':', ',', ' ', 'a', '1', '.', 'e', '-', 'true', 'nul', '"k"', '\\u12']
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 25)))
        assert isinstance(partial_object(text), dict)


def test_values_json_cannot_carry_end_the_object():
    # the answer is written back as JSON (UTF-8): NaN, Infinity, a float past its range, an int too
    # long for Python to read and an unpaired surrogate escape have no place in it; they end the object
    # as text that stops being JSON does, whole or cut alike
    long_int = "1" * 5000
    for bad in ("NaN", "Infinity", "-Infinity", "1e999", "-2.5e400", long_int, '"\\ud800"', '"x\\udfff"'):
        for tail in ("}", ', "b": 2}', ', "b": 2'):
            text = '{"a": 1, "z": ' + bad + tail
            got = partial_object(text)
            assert got == {"a": 1}, text[:40]
            json.dumps(got, ensure_ascii=False, allow_nan=False).encode()
    assert partial_object('{"\\udc00": 1, "a": 2}') == {}
    assert partial_object('{"a": ["\\ud800"]}') == {"a": []}
    # a surrogate pair is one character, and a long float that fits is a float
    assert partial_object('{"s": "\\ud83d\\ude00", "f": 1' + "0" * 300 + '.5}') == {"s": "\U0001F600", "f": 1e300}
