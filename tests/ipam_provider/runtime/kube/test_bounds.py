"""Hostile shapes are bounded: any JSON document decodes (orjson's own answer when it takes it, else with its deep
containers replaced by a marker), a cached object keeps at most MAX_DEPTH levels however deep it came, and a message
is cut to the API's limit keeping its beginning and its end."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipam_provider.cache import project_claim, project_pool
from ipam_provider.runtime.kube.bounds import (
    CONDITION_MESSAGE_LENGTH,
    DEEP_MARKER,
    DOCUMENT_DEPTH,
    EVENT_MESSAGE_LENGTH,
    MAX_DEPTH,
    cut_deep,
    cut_message,
    loads,
)
from tests.support.properties import examples


def nested(depth: int, leaf: Any = 1) -> Any:
    """`depth` levels of alternating lists and objects around `leaf`, built without recursion."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def depth_of(value: Any) -> int:
    """How many levels of containers `value` holds (iteratively: the values tested are deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def cut_model(value: Any, max_depth: int, level: int = 1) -> Any:
    """The brute-force model of the cut: every container deeper than `max_depth` becomes DEEP_MARKER."""
    if isinstance(value, dict | list) and level > max_depth:
        return DEEP_MARKER
    if isinstance(value, dict):
        return {key: cut_model(item, max_depth, level + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [cut_model(item, max_depth, level + 1) for item in value]
    return value


def deep_document(depth: int) -> bytes:
    """A claim whose spec holds a value nested `depth` levels deep, written as text (orjson cannot write it)."""
    head = b'{"metadata": {"name": "deep", "namespace": "ns"}, "spec": {"x": '
    return head + b'[{"k": ' * (depth // 2) + b'"a \\" ] } [ {"' + b"}]" * (depth // 2) + b"}}"


@pytest.mark.parametrize("depth", [600, 1_100, 5_000])
def test_a_document_of_any_depth_decodes_and_is_cut_where_the_projection_cuts_it(depth: int) -> None:
    raw = deep_document(depth)
    decoded = loads(raw)
    assert decoded["metadata"]["name"] == "deep"
    assert depth_of(decoded) <= max(DOCUMENT_DEPTH, min(depth + 2, 1_024))
    projected = project_claim(decoded)
    assert depth_of(projected) == MAX_DEPTH
    assert DEEP_MARKER in json.dumps(projected)


def test_strings_holding_brackets_and_escaped_quotes_are_skipped_whole() -> None:
    tricky = ['"[[[[', "}}}]]]", '\\"{', "\\", 'a\\"b"[', "é[ü{", "\n]", "\u2028"]
    strings = json.dumps(tricky, ensure_ascii=False).encode()
    raw = b'{"deep": ' + b'[{"k": ' * 600 + strings + b"}]" * 600 + b', "strings": ' + strings + b"}"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    decoded = loads(raw, max_depth=5)
    assert decoded["strings"] == tricky
    assert decoded == cut_model({"deep": nested(1_200, leaf=tricky), "strings": tricky}, 5)


def test_what_is_not_json_is_refused_as_orjson_refuses_it() -> None:
    for raw in (b"", b"{", b'{"a": [}', b"[" * 2_000, b"[" * 2_000 + b"}" * 2_000, b'"unterminated', b"]" * 3):
        with pytest.raises(orjson.JSONDecodeError):
            loads(raw)
    assert cut_deep(b"[" * 2_000, 10) is None, "unclosed brackets: nothing cut, orjson's own error stands"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=40,
)


@settings(max_examples=examples(300), deadline=None)
@given(value=json_values, max_depth=st.integers(min_value=0, max_value=6), ascii_only=st.booleans())
def test_the_cut_is_the_brute_force_models_on_any_document(value: Any, max_depth: int, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    cut = cut_deep(raw, max_depth)
    expected = cut_model(json.loads(raw), max_depth)
    assert (orjson.loads(cut) if cut is not None else orjson.loads(raw)) == expected
    assert (cut is None) == (expected == json.loads(raw)), "None exactly when nothing is deeper than the bound"
    assert loads(raw) == orjson.loads(raw), "an ordinary document decodes as orjson decodes it"


def test_the_projection_keeps_max_depth_levels_of_an_object_10000_deep() -> None:
    pool = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"customFields": {"f": nested(10_000)}}}
    projected = project_pool(pool)
    assert depth_of(projected) == MAX_DEPTH
    assert projected["metadata"] == {"name": "p", "namespace": "ns"}
    claim = {"metadata": {"name": "c", "labels": {"a": "b"}}, "spec": nested(10_000), "status": {}}
    assert depth_of(project_claim(claim)) == MAX_DEPTH
    assert project_claim(claim)["metadata"]["labels"] == {"a": "b"}


def test_the_projection_cuts_at_max_depth_exactly_as_the_decoder_does() -> None:
    pool = {"metadata": {"name": "p"}, "spec": {"f": nested(MAX_DEPTH * 2)}}
    assert project_pool(pool) == cut_model(pool, MAX_DEPTH)
    shallow = {"metadata": {"name": "p"}, "spec": {"f": nested(MAX_DEPTH - 2)}}
    assert project_pool(shallow) == shallow, "an object of MAX_DEPTH levels is kept whole"


@pytest.mark.parametrize("limit", [CONDITION_MESSAGE_LENGTH, EVENT_MESSAGE_LENGTH])
@pytest.mark.parametrize("unit", ["x", "é", "😀"])
def test_a_long_message_is_cut_to_the_limit_keeping_its_beginning_and_its_end(limit: int, unit: str) -> None:
    message = "annotation is '" + unit * 40_000 + "', which is not an IP address; fix or remove it"
    cut = cut_message(message, limit)
    assert len(cut) <= limit and len(cut.encode()) <= limit
    assert len(cut.encode()) > limit - 64, "no more is cut than needed"
    assert cut.startswith("annotation is '") and cut.endswith("; fix or remove it")
    assert "characters cut]" in cut
    assert cut_message(cut, limit) == cut


def test_a_message_within_the_limit_is_left_alone() -> None:
    for message in ("", "short", "x" * EVENT_MESSAGE_LENGTH, "é" * (EVENT_MESSAGE_LENGTH // 2)):
        assert cut_message(message, EVENT_MESSAGE_LENGTH) is message
