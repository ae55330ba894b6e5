"""The bounds that keep one hostile object from stopping the controller, and the API's limits on what we write.

- Nesting: an object the caches keep holds containers (objects, arrays) nested at most MAX_DEPTH levels deep (the
  object itself is level 1); a deeper one is replaced by the string DEEP_MARKER (`runtime/cache/projection.py`).
  `loads` decodes any JSON document, however deep: orjson refuses more than 1,024 levels, so a document it refuses
  is first cut at DOCUMENT_DEPTH by `cut_deep`, an O(n) scan of its bytes without recursion.
- Messages: `cut_message` shortens a text to a limit (CONDITION_MESSAGE_LENGTH, EVENT_MESSAGE_LENGTH), keeping its
  beginning and its end, which is where our messages say what to do.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

MAX_DEPTH = 64
DEEP_MARKER = f"<cut: nested deeper than {MAX_DEPTH} levels>"
DOCUMENT_DEPTH = MAX_DEPTH + 2
"""Where `loads` cuts a document orjson refuses: an object in a list page is at level 3, in a watch event at level
2, so the projection, not the decoder, decides where an object is cut."""

CONDITION_MESSAGE_LENGTH = 32768
"""metav1.Condition's message maxLength, as every CRD's conditions enforce it."""
EVENT_MESSAGE_LENGTH = 1024
"""kube-apiserver's NoteLengthLimit, in bytes: the longest message it accepts on an Event carrying eventTime (core/v1
Events without one are not checked, but client-go's recorders keep to it too)."""

_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)  # a string (even unterminated) or a bracket
_MARKER_JSON = orjson.dumps(DEEP_MARKER)
_OPENING = frozenset(b"[{")
_QUOTE = ord('"')


def loads(raw: bytes | str, max_depth: int = DOCUMENT_DEPTH) -> Any:
    """The JSON document `raw`, as orjson decodes it; a document orjson refuses only for its depth is decoded with
    every container deeper than `max_depth` replaced by DEEP_MARKER. Raises orjson.JSONDecodeError (a ValueError)
    when `raw` is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        cut = cut_deep(raw.encode() if isinstance(raw, str) else raw, max_depth)
        if cut is None:
            raise
        return orjson.loads(cut)


def cut_deep(raw: bytes, max_depth: int) -> bytes | None:
    """`raw` with every container nested deeper than `max_depth` replaced by DEEP_MARKER (a JSON string); None when
    there is none, or the brackets do not pair. Strings are skipped whole, brackets and escaped quotes in them
    included. Linear in the length of `raw`; it does not check that `raw` is JSON (orjson does that afterwards)."""
    parts: list[bytes] = []
    depth, copied, cut_from = 0, 0, -1
    for match in _TOKEN.finditer(raw):
        start = match.start()
        char = raw[start]
        if char == _QUOTE:
            continue
        if char in _OPENING:
            depth += 1
            if depth == max_depth + 1:
                cut_from = start
            continue
        depth -= 1
        if depth < 0:
            return None
        if depth == max_depth:
            parts += (raw[copied:cut_from], _MARKER_JSON)
            copied = match.end()
    if depth or not parts:
        return None
    parts.append(raw[copied:])
    return b"".join(parts)


def cut_message(text: str, limit: int) -> str:
    """`text` if it is at most `limit` characters and bytes (UTF-8) long; else its beginning and its end, joined by a
    note of how many characters were left out, in at most `limit` bytes."""
    if len(text) <= limit and (text.isascii() or len(text.encode("utf-8", "surrogatepass")) <= limit):
        return text
    encoded = text.encode("utf-8", "surrogatepass")
    budget = limit - len(" … [99999999999 characters cut] … ".encode())
    if budget < 2:
        return encoded[:limit].decode("utf-8", "ignore")
    head = encoded[: budget * 3 // 4].decode("utf-8", "ignore")  # a character cut in two is dropped
    tail = encoded[len(encoded) - (budget - budget * 3 // 4) :].decode("utf-8", "ignore")
    return f"{head} … [{len(text) - len(head) - len(tail)} characters cut] … {tail}"
