"""How the backends report a custom resource's spec that their pydantic models refuse."""

from __future__ import annotations

from pydantic import ValidationError


def spec_error(error: ValidationError) -> str:
    """The first problem pydantic found in a spec, as `spec.<field path>: <message>` (the path in the model's
    field names or aliases, as pydantic reports them)."""
    first = error.errors()[0]
    return f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
