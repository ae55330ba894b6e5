"""The WAPI request dispatcher, independent of HTTP transport, authentication and faults.

Contract: :meth:`WapiApi.handle` takes a :class:`WapiRequest` (method, the path after ``/wapi/v<version>/``
already percent-decoded once, query pairs, raw body) and answers a :class:`WapiResponse`; it never raises
for a client mistake, it answers the WAPI error instead.  Routes:

* ``GET <type>`` search (200, a list, or ``{"result": ...}`` with ``_return_as_object=1`` / paging);
* ``GET <ref>`` read (200, the object; 404 ``Client.Ibap.Data.NotFound`` for an unknown ref);
* ``POST <type>`` create (201, the JSON string ref, or the object when return fields were asked);
* ``PUT <ref>`` update (200, the ref -- new if the natural key changed -- or the object);
* ``DELETE <ref>`` delete (200, the ref);
* ``POST <network|ipv6network|range ref>?_function=next_available_ip`` (200, ``{"ips": [...]}``);
* ``view`` and ``zone_auth`` are read-only here: POST, PUT and DELETE on them answer 400 ``Client.Ibap.Proto``
  ``Operation <create|update|delete> not allowed for <type>`` (seed them with :class:`~.state.SimulatorState`);
* an unknown object type answers 400 ``Unknown object type (<type>)``; a body that is not JSON answers 400
  ``Client.Ibap.Proto.JSONDecoding``;
* an internal simulator failure answers 500 ``Server.Simulator`` (and is logged), never a silent drop.

Every request runs under the store lock, so each request is atomic with respect to every other.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from . import errors, handlers
from .allocation import next_available_ip_function
from .search import Pager, QueryOptions, parse_query, return_field_names
from .store import ObjectStore

_LOG = logging.getLogger(__name__)
_FUNCTIONS = {"next_available_ip": ("network", "ipv6network", "range")}
READ_ONLY_TYPES = frozenset({"view", "zone_auth"})
_OPERATIONS = {"POST": "create", "PUT": "update", "DELETE": "delete"}


@dataclass(frozen=True)
class WapiRequest:
    """One WAPI call, transport-independent."""

    method: str
    path: str
    query: list[tuple[str, str]]
    body: bytes = b""


@dataclass
class WapiResponse:
    """One WAPI answer: a JSON payload or an error."""

    status: int
    payload: Any = None
    error: errors.WapiError | None = None

    def body(self) -> bytes:
        """The response body, formatted like NIOS (4-space indented JSON, or the NIOS error layout)."""
        if self.error is not None:
            return self.error.body()
        return json.dumps(self.payload, indent=4).encode()


def _coerce(kind: str, text: str) -> Any:
    """A query-string field value converted to the kind of its field (query values are always strings)."""
    if kind == "bool":
        return {"true": True, "false": False}.get(text.lower(), text)
    if kind in ("int", "uint"):
        try:
            return int(text)
        except ValueError:
            return text
    return text


class WapiApi:
    """Dispatches WAPI calls against one :class:`~.store.ObjectStore`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.pager = Pager()

    def handle(self, request: WapiRequest) -> WapiResponse:
        """Answer one call (see module docstring)."""
        try:
            with self.store.lock:
                return self._dispatch(request)
        except errors.WapiError as exc:
            return WapiResponse(exc.status, error=exc)
        except Exception as exc:  # a simulator bug: answer it visibly rather than dropping the connection
            _LOG.exception("WAPI simulator failed on %s %s", request.method, request.path)
            text = f"WAPI simulator internal error: {exc!r}"
            return WapiResponse(500, error=errors.WapiError(500, text, "Server.Simulator", text))

    def _dispatch(self, request: WapiRequest) -> WapiResponse:
        obj_type, _, rest = request.path.partition("/")
        schema = handlers.schema_for(obj_type)
        ref = request.path if rest else None
        opts = parse_query(request.query)
        method = request.method
        if obj_type in READ_ONLY_TYPES and method in _OPERATIONS:
            raise errors.proto(f"Operation {_OPERATIONS[method]} not allowed for {obj_type}")
        if method == "GET":
            if ref is None:
                return WapiResponse(200, self.pager.search(self.store, schema, opts))
            names = return_field_names(schema, opts)
            obj = self.store.get(ref)
            if obj is None:
                raise errors.ref_not_found(ref)
            return self._answer(200, handlers.render(self.store, obj, names), opts)
        if method == "DELETE":
            if ref is None:
                raise errors.proto("DELETE needs an object reference")
            return self._answer(200, handlers.delete_object(self.store, ref), opts)
        body = self._body(request, schema.fields, opts)
        if method == "POST" and opts.function is not None:
            return self._function(ref or obj_type, opts.function, body, opts)
        if method == "POST":
            if ref is not None:
                raise errors.proto("POST on an object reference needs _function")
            names = return_field_names(schema, opts)
            obj = handlers.create_object(self.store, obj_type, body)
            payload = handlers.render(self.store, obj, names) if opts.wants_object else obj.ref
            return self._answer(201, payload, opts)
        if method == "PUT":
            if ref is None:
                raise errors.proto("PUT needs an object reference")
            names = return_field_names(schema, opts)
            obj = handlers.update_object(self.store, ref, body)
            payload = handlers.render(self.store, obj, names) if opts.wants_object else obj.ref
            return self._answer(200, payload, opts)
        raise errors.proto(f"Method {method} is not supported")

    @staticmethod
    def _answer(status: int, payload: Any, opts: QueryOptions) -> WapiResponse:
        return WapiResponse(status, {"result": payload} if opts.as_object else payload)

    @staticmethod
    def _body(request: WapiRequest, fields: dict[str, Any], opts: QueryOptions) -> Any:
        if request.body.strip():
            try:
                body = json.loads(request.body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise errors.json_decoding(str(exc)) from None
        else:
            body = {}
        for key, value in opts.arguments:
            if not isinstance(body, dict):
                break
            if key in body:
                raise errors.proto(f"Arguments can not be repeated ({key})")
            spec = fields.get(key.rstrip("+-"))
            body[key] = _coerce(spec.kind, value) if spec is not None else value
        return body

    def _function(self, target: str, name: str, body: Any, opts: QueryOptions) -> WapiResponse:
        allowed = _FUNCTIONS.get(name)
        obj = self.store.get(target)
        if allowed is None:
            raise errors.proto(f"Function {name} is not supported by the WAPI simulator")
        if obj is None:
            if "/" in target:
                raise errors.ref_not_found(target)
            raise errors.proto(f"Function {name} illegal with this method")
        if obj.obj_type not in allowed:
            raise errors.proto(f"Function {name} is not valid for this object type")
        if not isinstance(body, dict):
            raise errors.proto("The request body must be a JSON object")
        return self._answer(200, next_available_ip_function(self.store, obj, body), opts)
