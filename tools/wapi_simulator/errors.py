"""WAPI error shapes.

Contract: every refusal the simulator makes is a :class:`WapiError` carrying the HTTP status and the three
fields NIOS puts in an error body, ``Error``, ``code`` and ``text``.  :meth:`WapiError.body` renders them the
way NIOS does (one field per line, two-space indent).  The helper constructors below fix the status and the
``Error`` prefix for each error family; the wording of each ``text`` is chosen by the caller.

Families (status, code, ``Error`` prefix):

* protocol errors -- 400, ``Client.Ibap.Proto``, ``AdmConProtoError: <text>``
  (unknown field, unknown object type, bad value, missing required field, bad search, ...);
* JSON decoding -- 400, ``Client.Ibap.Proto.JSONDecoding``, ``AdmConProtoError: JSON Decoding: <detail>``;
* data errors -- 400, ``Client.Ibap.Data``, ``AdmConDataError: None (IBDataError: IB.Data:<text>)``
  (e.g. no free address);
* conflicts -- 400, ``Client.Ibap.Data.Conflict``,
  ``AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:<text>)``;
* not found -- 404, ``Client.Ibap.Data.NotFound``, ``AdmConDataNotFoundError: <text>``.
"""

from __future__ import annotations

import json

JSON_CONTENT_TYPE = "application/json"


class WapiError(Exception):
    """An error answer: HTTP ``status`` plus the NIOS ``Error``/``code``/``text`` triple."""

    def __init__(self, status: int, error: str, code: str, text: str) -> None:
        super().__init__(f"{status} {code}: {text}")
        self.status = status
        self.error = error
        self.code = code
        self.text = text

    def as_dict(self) -> dict[str, str]:
        """The error body as a dict (``Error``, ``code``, ``text``)."""
        return {"Error": self.error, "code": self.code, "text": self.text}

    def body(self) -> bytes:
        """The error body, formatted like NIOS formats it."""
        lines = [
            '{ "Error": ' + json.dumps(self.error) + ",",
            '  "code": ' + json.dumps(self.code) + ",",
            '  "text": ' + json.dumps(self.text),
            "}",
        ]
        return "\n".join(lines).encode()


def proto(text: str) -> WapiError:
    """A malformed or unsupported request (400, ``Client.Ibap.Proto``)."""
    return WapiError(400, f"AdmConProtoError: {text}", "Client.Ibap.Proto", text)


def json_decoding(detail: str) -> WapiError:
    """A request body that is not valid JSON (400, ``Client.Ibap.Proto.JSONDecoding``)."""
    text = f"JSON Decoding: {detail}"
    return WapiError(400, f"AdmConProtoError: {text}", "Client.Ibap.Proto.JSONDecoding", text)


def data(text: str) -> WapiError:
    """A data error such as an exhausted network (400, ``Client.Ibap.Data``)."""
    return WapiError(400, f"AdmConDataError: None (IBDataError: IB.Data:{text})", "Client.Ibap.Data", text)


def conflict(text: str) -> WapiError:
    """A conflict with existing data (400, ``Client.Ibap.Data.Conflict``)."""
    error = f"AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:{text})"
    return WapiError(400, error, "Client.Ibap.Data.Conflict", text)


def not_found(text: str) -> WapiError:
    """A missing object (404, ``Client.Ibap.Data.NotFound``)."""
    return WapiError(404, f"AdmConDataNotFoundError: {text}", "Client.Ibap.Data.NotFound", text)


def ref_not_found(ref: str) -> WapiError:
    """``GET``/``PUT``/``DELETE`` on a reference that does not exist."""
    return not_found(f"Reference {ref} not found")


def unknown_field(name: str) -> WapiError:
    """A field (in a body, a search or ``_return_fields``) that the object type does not have."""
    return proto(f"Unknown argument/field: '{name}'")


def missing_field(name: str) -> WapiError:
    """A required field absent on create."""
    return proto(f"field for create missing: {name}")


def invalid_value(name: str, value: object, expected: str) -> WapiError:
    """A field whose value has the wrong type, e.g. ``Must be string type``."""
    return proto(f"Invalid value for {name}: {json.dumps(value)}: {expected}")


def no_free_address(count: int = 1) -> WapiError:
    """``func:nextavailableip`` (or ``next_available_ip``) found too few free addresses."""
    return data(f"Cannot find {count} available IP address(es) in this network.")


def unknown_extattr(name: str) -> WapiError:
    """An extensible attribute written or searched before its ``extensibleattributedef`` exists."""
    return proto(f"Unknown extensible attribute: {name}")


def parent_not_found() -> WapiError:
    """An address or DNS name with no enclosing network or zone."""
    return conflict("The action is not allowed. A parent was not found.")
