"""Helpers shared by the per-type rules: applying a body's changes and modifiers, and telling objects apart.

Contract: :func:`merge` applies plain changes, then ``+``/``-`` modifiers (``extattrs+`` adds or replaces
attributes, ``extattrs-`` removes them by name; list fields gain the values they lack or lose the listed ones);
:func:`is_other` says whether a found object is another object than the one being updated.
"""

from __future__ import annotations

from typing import Any

from .store import StoredObject

Modifiers = dict[str, tuple[str, Any]]


def merge(fields: dict[str, Any], changes: dict[str, Any], modifiers: Modifiers) -> None:
    """Apply ``changes`` then ``modifiers`` to ``fields`` in place."""
    fields.update(changes)
    for name, (op, value) in modifiers.items():
        if name == "extattrs":
            current = fields.setdefault("extattrs", {})
            if op == "+":
                current.update(value)
            else:
                for key in value:
                    current.pop(key, None)
        else:
            items = list(fields.get(name) or [])
            fields[name] = (
                items + [v for v in value if v not in items] if op == "+" else [v for v in items if v not in value]
            )


def is_other(obj: StoredObject | None, old: StoredObject | None) -> bool:
    """Whether ``obj`` exists and is not ``old`` (the object being updated, ``None`` on create)."""
    return obj is not None and (old is None or obj.ref != old.ref)
