"""A faithful Infoblox NIOS WAPI simulator, for testing the Infoblox backend through the real infoblox-client.

It is an HTTP(S) server on 127.0.0.1 that follows the documented WAPI shapes (what it covers and what it
does not: docs/infoblox.md): routes under ``/wapi/v2.<n>/``, object references,
``_return_fields`` / ``_return_fields+``, ``func:nextavailableip``, search (including ``*<EA>=`` search),
paging, the NIOS error bodies, HTTP basic authentication with the ``ibapauth`` cookie, and fault injection.

Objects: ``networkview``, ``network``, ``ipv6network``, ``range``, ``fixedaddress``, ``ipv6fixedaddress``,
``record:host`` and ``extensibleattributedef``, plus the read-only ``view`` (DNS view) and ``zone_auth``
(authoritative zone), seeded with ``state.add_dns_view`` / ``state.add_zone``.  The module docstrings state each
contract: :mod:`.rules` (per-type rules), :mod:`.dns` (DNS views and zones), :mod:`.names` (lower-case DNS names,
their length limits, IPAM-only host records' blank view), :mod:`.allocation` (next available
address), :mod:`.search` (query, search, paging), :mod:`.api` (routes), :mod:`.auth`, :mod:`.faults`,
:mod:`.server`.

Write-time bindings NIOS enforces across objects (attributes restricted to object types, a host record's network
view) are in :mod:`.bindings`.

In tests::

    pytest_plugins = ["tools.wapi_simulator.fixtures"]

    def test_allocate(wapi_simulator):
        wapi_simulator.state.add_network("10.0.0.0/24")
        wapi_simulator.state.add_ea_definition("Claim")
        conn = wapi_simulator.connector()          # a real infoblox_client Connector, CA verification on
        ...
        assert wapi_simulator.request_log.count("POST", "fixedaddress") == 1
        wapi_simulator.faults.fail_next(2, methods="POST")   # the next two POSTs answer 503

Outside pytest::

    with WapiSimulator() as sim:                     # TLS on a free port
        sim.state.add_network("10.0.0.0/24")
        print(sim.url, sim.ca_path)

As a command (serves until interrupted; prints the URL, credentials and CA path)::

    python -m tools.wapi_simulator --port 8443 --seed-network 10.0.0.0/24 --seed-ea Claim
"""

from __future__ import annotations

from .errors import WapiError
from .faults import FaultInjector, FaultRule, LoggedRequest, RequestLog
from .server import WapiSimulator
from .state import SimulatorState
from .tls import TlsMaterial, make_tls_material

__all__ = [
    "FaultInjector",
    "FaultRule",
    "LoggedRequest",
    "RequestLog",
    "SimulatorState",
    "TlsMaterial",
    "WapiError",
    "WapiSimulator",
    "make_tls_material",
]
