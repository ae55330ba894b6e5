"""Grid-wide bindings real NIOS grids enforce, pinned request by request: extensible-attribute definitions
restricted by ``allowed_object_types``, and the one network view of a host record's DNS view.

Each test cites the public record of the real behaviour it models (docs/infoblox.md, "Fidelity").
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.tools.wapi_simulator.test_server import call
from tools.wapi_simulator import WapiSimulator

pytest_plugins = ["tools.wapi_simulator.fixtures"]

# The exact body of the refusal, as terraform-provider-infoblox issue #420 (a record created with an attribute
# restricted to other object types) and infoblox-client issue #89 (an update, same body) recorded it.
NOT_ALLOWED = {
    "Error": (
        "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:"
        "Extensible attribute 'CAPI-Pool' is not allowed for this operation)"
    ),
    "code": "Client.Ibap.Data.Conflict",
    "text": "Extensible attribute 'CAPI-Pool' is not allowed for this operation",
}


@pytest.fixture
def grid(wapi_simulator: WapiSimulator) -> WapiSimulator:
    state = wapi_simulator.state
    state.add_network("10.0.0.0/24")
    state.add_network_view("nv2")
    state.add_network("10.2.0.0/24", network_view="nv2")
    state.add_zone("example.com")
    state.add_zone("example.com", view="default.nv2")
    return wapi_simulator


def post(sim: WapiSimulator, obj_type: str, body: dict[str, Any], fields: str = "") -> requests.Response:
    params = {"_return_fields": fields} if fields else None
    return call(sim, "POST", obj_type, json=body, params=params)


def pool_ea(value: str = "ns/pool") -> dict[str, Any]:
    return {"CAPI-Pool": {"value": value}}


# -- extensible attributes restricted by allowed_object_types ---------------------------------------------------


def test_a_definition_restricted_to_other_types_refuses_the_attribute_with_the_nios_body(grid: WapiSimulator) -> None:
    # Source: terraform-provider-infoblox #420 (POST refused) and infoblox-client #89 (PUT refused), both
    # 400 Client.Ibap.Data.Conflict with this text. The WAPI docs list allowed_object_types as a string array,
    # not searchable; NIOS's own tests write the types as "Network", "IPv6Network".
    grid.state.add_ea_definition("CAPI-Pool", allowed_object_types=["Network", "IPv6Network"])
    answer = call(
        grid,
        "GET",
        "extensibleattributedef",
        params={"name": "CAPI-Pool", "_return_fields": "name,allowed_object_types"},
    )
    assert answer.status_code == 200
    assert [{k: v for k, v in d.items() if k != "_ref"} for d in answer.json()] == [
        {"name": "CAPI-Pool", "allowed_object_types": ["Network", "IPv6Network"]}
    ]
    fixed = {"ipv4addr": "10.0.0.5", "mac": "00:00:00:00:00:00", "extattrs": pool_ea()}
    refused = post(grid, "fixedaddress", fixed)
    assert (refused.status_code, refused.json()) == (400, NOT_ALLOWED)
    host = {"name": "h.example.com", "ipv4addrs": [{"ipv4addr": "10.0.0.6"}], "extattrs": pool_ea()}
    refused = post(grid, "record:host", host)
    assert (refused.status_code, refused.json()) == (400, NOT_ALLOWED)
    assert grid.state.count("fixedaddress") == grid.state.count("record:host") == 0, "a refusal stores nothing"
    # Allowed on the restricted types themselves; a network carries it.
    network = post(grid, "network", {"network": "10.9.0.0/24", "extattrs": pool_ea()})
    assert network.status_code == 201, network.text


def test_allowed_types_admit_their_objects_case_blind_and_updates_are_checked_too(grid: WapiSimulator) -> None:
    # Source: as above; infoblox-client #89 shows the same refusal on a PUT of extattrs.
    grid.state.add_ea_definition("CAPI-Pool", allowed_object_types=["fixedaddress", "HostRecord"])
    grid.state.add_ea_definition("Free")
    fixed = post(grid, "fixedaddress", {"ipv4addr": "10.0.0.5", "mac": "00:00:00:00:00:00", "extattrs": pool_ea()})
    assert fixed.status_code == 201, fixed.text
    v6 = {"network": "fd00::/64"}
    assert post(grid, "ipv6network", v6).status_code == 201
    duid = "00:04:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:01"
    refused = post(grid, "ipv6fixedaddress", {"ipv6addr": "fd00::5", "duid": duid, "extattrs": pool_ea()})
    assert (refused.status_code, refused.json()) == (400, NOT_ALLOWED)
    free = post(grid, "ipv6fixedaddress", {"ipv6addr": "fd00::5", "duid": duid, "extattrs": {"Free": {"value": "x"}}})
    assert free.status_code == 201, free.text
    ref = json.loads(free.text)
    for body in ({"extattrs": pool_ea()}, {"extattrs+": pool_ea()}):
        refused = call(grid, "PUT", ref, json=body)
        assert (refused.status_code, refused.json()) == (400, NOT_ALLOWED)
    assert grid.state.extattrs(ref) == {"Free": "x"}
    # Searching on a restricted attribute is not writing it.
    assert call(grid, "GET", "ipv6fixedaddress", params={"*CAPI-Pool": "ns/pool"}).json() == []


# -- a host record's DNS view belongs to one network view -----------------------------------------------------------


def test_a_host_takes_its_addresses_from_its_dns_views_network_view(grid: WapiSimulator) -> None:
    # Source: the WAPI docs give `view` a `network_view` and `networkview` its `associated_dns_views`; a DNS view
    # belongs to one network view. NIOS's text for this refusal is not public: the simulator answers the
    # documented shape for a bad value (400 Client.Ibap.Proto "Invalid value for ...").
    body = {
        "name": "h.example.com",
        "view": "default",
        "ipv4addrs": [{"ipv4addr": "func:nextavailableip:10.2.0.0/24,nv2"}],
    }
    refused = post(grid, "record:host", body)
    text = (
        'Invalid value for ipv4addr: "func:nextavailableip:10.2.0.0/24,nv2": '
        "the host record's DNS view belongs to network view default"
    )
    assert (refused.status_code, refused.json()) == (
        400,
        {"Error": f"AdmConProtoError: {text}", "code": "Client.Ibap.Proto", "text": text},
    )
    assert grid.state.count("record:host") == 0
    assert grid.state.used_addresses("nv2") == [], "nothing was taken from nv2"
    # In nv2's own DNS view the same address source is right.
    made = post(grid, "record:host", {**body, "view": "default.nv2"}, fields="name,view,network_view,ipv4addrs")
    assert made.status_code == 201, made.text
    answer = made.json()
    assert (answer["view"], answer["network_view"]) == ("default.nv2", "nv2")
    assert answer["ipv4addrs"][0]["ipv4addr"] == "10.2.0.1"


def test_a_host_post_may_name_its_network_view_which_must_be_its_dns_views(grid: WapiSimulator) -> None:
    # Source: infoblox-go-client's HostRecord carries `network_view` and NewHostRecord sets it, so real clients
    # (the Terraform provider) send it on POST; the WAPI docs describe it as the network view the record resides
    # in (searchable with '='; infoblox-client's generated schema does not list it as updatable). The refusal
    # texts are the simulator's choice (NIOS's are not public).
    body = {
        "name": "h.example.com",
        "view": "default.nv2",
        "network_view": "nv2",
        "ipv4addrs": [{"ipv4addr": "func:nextavailableip:10.2.0.0/24,nv2"}],
    }
    made = post(grid, "record:host", body, fields="network_view")
    assert made.status_code == 201, made.text
    assert made.json()["network_view"] == "nv2"
    assert [h["name"] for h in call(grid, "GET", "record:host", params={"network_view": "nv2"}).json()] == [
        "h.example.com"
    ]
    mismatch = post(grid, "record:host", {**body, "name": "g.example.com", "view": "default"})
    text = 'Invalid value for network_view: "nv2": DNS view default belongs to network view default'
    assert (mismatch.status_code, mismatch.json()["code"], mismatch.json()["text"]) == (400, "Client.Ibap.Proto", text)
    missing = post(grid, "record:host", {**body, "name": "g.example.com", "network_view": "nope"})
    assert (missing.status_code, missing.json()["text"]) == (404, "Network view nope not found")
    update = call(grid, "PUT", made.json()["_ref"], json={"network_view": "default"})
    assert (update.status_code, update.json()["text"]) == (400, "Field is not allowed for update: network_view")
    assert grid.state.count("record:host") == 1
