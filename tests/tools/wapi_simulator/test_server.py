"""The WAPI simulator against the documented WAPI shapes, exercised through the real infoblox-client 0.6.2.

Raw ``requests`` calls are used where the client cannot express something (exact status codes and bodies,
paging pages, cookie-only requests).  Several tests also pin infoblox-client behaviour the Infoblox backend
depends on (how many requests a failing GET costs, which faults the client retries by itself).
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from infoblox_client import exceptions as ib_ex
from infoblox_client import objects as ib

from tools.wapi_simulator import WapiError, WapiSimulator, make_tls_material
from tools.wapi_simulator.auth import Authenticator

pytest_plugins = ["tools.wapi_simulator.fixtures"]

REF = re.compile(r"^(?P<type>[a-z0-9:_]+)/(?P<opaque>[A-Za-z0-9_-]+):(?P<name>.+)$")
NO_FREE = {
    "Error": "AdmConDataError: None (IBDataError: IB.Data:Cannot find 1 available IP address(es) in this network.)",
    "code": "Client.Ibap.Data",
    "text": "Cannot find 1 available IP address(es) in this network.",
}


def call(
    sim: WapiSimulator, method: str, path: str, session: requests.Session | None = None, **kwargs: Any
) -> requests.Response:
    """A raw WAPI call with basic auth and CA verification."""
    kwargs.setdefault("auth", (sim.username, sim.password))
    url = sim.url + quote(path)  # as infoblox-client does: a ref's own %-escapes survive one decoding
    return (session or requests).request(method, url, verify=str(sim.ca_path), timeout=10, **kwargs)


def alloc_fixed(conn: Any, cidr: str = "10.0.0.0/24", view: str = "default", **extra: Any) -> Any:
    """One allocation the way the backend does it: FixedAddress.create with func:nextavailableip."""
    return ib.FixedAddress.create(
        conn,
        check_if_exists=False,
        network_view=view,
        mac="00:00:00:00:00:00",
        ip=ib.IPAllocation.next_available_ip_from_cidr(view, cidr),
        **extra,
    )


@pytest.fixture
def sim(wapi_simulator: WapiSimulator) -> WapiSimulator:
    wapi_simulator.state.add_network("10.0.0.0/24")
    wapi_simulator.state.add_ea_definition("Claim")
    return wapi_simulator


# -- allocation -------------------------------------------------------------------------------------------


def test_fixedaddress_nextavailableip_answers_object_with_return_fields(sim: WapiSimulator) -> None:
    conn = sim.connector()
    fixed = alloc_fixed(conn, extattrs=ib.EA({"Claim": "uid-1"}))
    assert fixed.ip == "10.0.0.1"
    assert fixed.extattrs.get("Claim") == "uid-1"
    assert fixed.network_view == "default"
    assert fixed.mac == "00:00:00:00:00:00"
    assert REF.match(fixed.ref).group("name") == "10.0.0.1/default"  # type: ignore[union-attr]
    assert sim.request_log.counts() == {("POST", "fixedaddress"): 1}
    assert "_return_fields=extattrs%2Cipv4addr%2Cnetwork_view%2Cmac" in sim.request_log.entries[0].query


def test_post_without_return_fields_answers_201_with_bare_ref(sim: WapiSimulator) -> None:
    body = {"ipv4addr": "func:nextavailableip:10.0.0.0/24,default", "mac": "00:00:00:00:00:00"}
    response = call(sim, "POST", "fixedaddress", json=body)
    assert response.status_code == 201
    ref = response.json()
    assert isinstance(ref, str)
    match = REF.match(ref)
    assert match is not None and match.group("type") == "fixedaddress"
    assert match.group("name") == "10.0.0.1/default"
    with_fields = call(sim, "POST", "fixedaddress", json=body, params={"_return_fields": "ipv4addr"})
    assert with_fields.status_code == 201
    assert set(with_fields.json()) == {"_ref", "ipv4addr"} and with_fields.json()["ipv4addr"] == "10.0.0.2"


def test_lowest_first_skips_network_and_broadcast_then_exhaustion(wapi_simulator: WapiSimulator) -> None:
    wapi_simulator.state.add_network("10.9.0.0/29")
    conn = wapi_simulator.connector()
    got = [alloc_fixed(conn, "10.9.0.0/29").ip for _ in range(6)]
    assert got == [f"10.9.0.{i}" for i in range(1, 7)]
    with pytest.raises(ib_ex.InfobloxCannotCreateObject) as failure:
        alloc_fixed(conn, "10.9.0.0/29")
    assert failure.value.kwargs["code"] == 400
    assert failure.value.response == NO_FREE


def test_exhaustion_body_and_status_are_exact(wapi_simulator: WapiSimulator) -> None:
    wapi_simulator.state.add_network("10.9.0.0/31")
    body = {"ipv4addr": "func:nextavailableip:10.9.0.0/31,default", "mac": "00:00:00:00:00:00"}
    assert [call(wapi_simulator, "POST", "fixedaddress", json=body).status_code for _ in range(2)] == [201, 201]
    response = call(wapi_simulator, "POST", "fixedaddress", json=body)
    assert response.status_code == 400
    assert response.json() == NO_FREE
    assert response.headers["Content-Type"] == "application/json"
    assert response.text.startswith('{ "Error": ')


def test_allocation_skips_fixed_host_and_dhcp_range_addresses(sim: WapiSimulator) -> None:
    sim.state.add_fixed_address("10.0.0.1")
    sim.state.add_host_record("used.example.com", "10.0.0.2")
    sim.state.add_range("10.0.0.3", "10.0.0.5")
    sim.state.add_fixed_address("10.0.0.7")
    conn = sim.connector()
    assert [alloc_fixed(conn).ip for _ in range(2)] == ["10.0.0.6", "10.0.0.8"]


def test_range_form_allocates_inside_the_range_and_honours_exclusions(sim: WapiSimulator) -> None:
    sim.state.add_range("10.0.0.10", "10.0.0.13", exclude=[{"start_address": "10.0.0.11", "end_address": "10.0.0.11"}])
    conn = sim.connector()
    ip = ib.IPAllocation.next_available_ip_from_range("default", "10.0.0.10", "10.0.0.13")
    assert str(ip) == "func:nextavailableip:10.0.0.10-10.0.0.13,default"
    made = [ib.FixedAddress.create(conn, check_if_exists=False, mac="00:00:00:00:00:00", ip=ip).ip for _ in range(3)]
    assert made == ["10.0.0.10", "10.0.0.12", "10.0.0.13"]
    with pytest.raises(ib_ex.InfobloxCannotCreateObject) as failure:
        ib.FixedAddress.create(conn, check_if_exists=False, mac="00:00:00:00:00:00", ip=ip)
    assert failure.value.response["code"] == "Client.Ibap.Data"


def test_network_reference_form_and_unknown_network(sim: WapiSimulator) -> None:
    net_ref = sim.state.refs("network")[0]
    body = {"ipv4addr": f"func:nextavailableip:{net_ref}", "mac": "00:00:00:00:00:00"}
    assert call(sim, "POST", "fixedaddress", json=body).json().endswith(":10.0.0.1/default")
    missing = {"ipv4addr": "func:nextavailableip:10.7.0.0/24,default", "mac": "00:00:00:00:00:00"}
    response = call(sim, "POST", "fixedaddress", json=missing)
    assert response.status_code == 400
    assert response.json() == {
        "Error": "AdmConProtoError: 10.7.0.0/24,default does not match any unique networks/ranges (ipv4addr)",
        "code": "Client.Ibap.Proto",
        "text": "10.7.0.0/24,default does not match any unique networks/ranges (ipv4addr)",
    }
    other_view = {"ipv4addr": "func:nextavailableip:10.0.0.0/24,elsewhere", "mac": "00:00:00:00:00:00"}
    assert call(sim, "POST", "fixedaddress", json=other_view).status_code == 400


def test_ipv6_fixed_address_skips_subnet_router_anycast(wapi_simulator: WapiSimulator) -> None:
    wapi_simulator.state.add_network("2001:db8::/120")
    conn = wapi_simulator.connector()
    fixed = ib.FixedAddress.create(
        conn,
        check_if_exists=False,
        network_view="default",
        mac="aa:bb:cc:dd:ee:ff",
        ip=ib.IPAllocation.next_available_ip_from_cidr("default", "2001:db8::/120"),
    )
    assert fixed.ip == "2001:db8::1"
    assert fixed.duid == "00:dd:ee:ff:aa:bb:cc:dd:ee:ff"  # the client derives it from the MAC
    assert fixed.ref.startswith("ipv6fixedaddress/")
    assert fixed.ref.endswith(":2001%3Adb8%3A%3A1/default")
    assert wapi_simulator.request_log.counts() == {("POST", "ipv6fixedaddress"): 1}


def test_host_record_nextavailableip_and_duplicate_name(sim: WapiSimulator) -> None:
    sim.state.add_network("2001:db8::/64")
    conn = sim.connector()
    host = ib.HostRecord.create(
        conn,
        check_if_exists=False,
        name="node-1.example.com",
        view="default",
        configure_for_dns=False,
        ip=[ib.IPv4(ip=ib.IPAllocation.next_available_ip_from_cidr("default", "10.0.0.0/24"))],
        extattrs=ib.EA({"Claim": "uid-7"}),
    )
    assert host.ipv4addrs[0].ip == "10.0.0.1"
    assert host.ref.startswith("record:host/") and host.ref.endswith(":node-1.example.com/%20")  # IPAM-only
    entry = conn.get_object(host.ref, return_fields=["ipv4addrs"])["ipv4addrs"][0]
    assert entry == {
        "_ref": entry["_ref"],
        "configure_for_dhcp": False,
        "host": "node-1.example.com",
        "ipv4addr": "10.0.0.1",
    }
    assert entry["_ref"].startswith("record:host_ipv4addr/") and entry["_ref"].endswith(
        ":10.0.0.1/node-1.example.com/%20"
    )
    body = {
        "name": "node-2.example.com",
        "configure_for_dns": False,
        "ipv4addrs": [{"ipv4addr": "func:nextavailableip:10.0.0.0/24,default"}],
        "ipv6addrs": [{"ipv6addr": "func:nextavailableip:2001:db8::/64,default"}],
    }
    created = call(sim, "POST", "record:host", json=body, params={"_return_fields": "ipv4addrs,ipv6addrs"})
    assert [e["ipv4addr"] for e in created.json()["ipv4addrs"]] == ["10.0.0.2"]
    assert [e["ipv6addr"] for e in created.json()["ipv6addrs"]] == ["2001:db8::1"]
    with pytest.raises(ib_ex.InfobloxCannotCreateObject) as failure:
        ib.HostRecord.create(
            conn,
            check_if_exists=False,
            name="NODE-1.example.com",
            configure_for_dns=False,
            ip=[ib.IPv4(ip="10.0.0.99")],
        )
    assert failure.value.response == {
        "Error": "AdmConDataError: None (IBDataConflictError: IB.Data.Conflict:The record 'node-1.example.com' "
        "already exists.)",
        "code": "Client.Ibap.Data.Conflict",
        "text": "The record 'node-1.example.com' already exists.",
    }


def test_host_record_in_dns_needs_a_zone(sim: WapiSimulator) -> None:
    body = {"name": "web.example.com", "ipv4addrs": [{"ipv4addr": "10.0.0.20"}]}
    refused = call(sim, "POST", "record:host", json=body)
    assert refused.status_code == 400
    assert refused.json()["text"] == "The action is not allowed. A parent was not found."
    assert refused.json()["code"] == "Client.Ibap.Data.Conflict"
    sim.state.add_zone("example.com")
    created = call(sim, "POST", "record:host", json=body, params={"_return_fields+": "zone,configure_for_dns"})
    assert created.status_code == 201
    assert created.json()["zone"] == "example.com" and created.json()["configure_for_dns"] is True
    unknown_view = call(sim, "POST", "record:host", json={**body, "name": "x.example.com", "view": "nope"})
    assert unknown_view.status_code == 404
    assert unknown_view.json()["text"] == "View nope not found"


def test_address_conflicts_dhcp_versus_plain_dns(sim: WapiSimulator) -> None:
    sim.state.add_fixed_address("10.0.0.50")
    again = call(sim, "POST", "fixedaddress", json={"ipv4addr": "10.0.0.50", "mac": "aa:aa:aa:aa:aa:aa"})
    assert again.status_code == 400 and again.json()["code"] == "Client.Ibap.Data.Conflict"
    plain = {"name": "a.example.com", "configure_for_dns": False, "ipv4addrs": [{"ipv4addr": "10.0.0.50"}]}
    assert call(sim, "POST", "record:host", json=plain).status_code == 201
    dhcp_entry = {"ipv4addr": "10.0.0.50", "configure_for_dhcp": True, "mac": "bb:bb:bb:bb:bb:bb"}
    dhcp = {"name": "b.example.com", "configure_for_dns": False, "ipv4addrs": [dhcp_entry]}
    refused = call(sim, "POST", "record:host", json=dhcp)
    assert refused.status_code == 400 and refused.json()["code"] == "Client.Ibap.Data.Conflict"
    outside = call(sim, "POST", "fixedaddress", json={"ipv4addr": "192.0.2.1", "mac": "aa:aa:aa:aa:aa:aa"})
    assert outside.json()["text"] == "The action is not allowed. A parent was not found."
    assert sim.state.count("fixedaddress") == 1 and sim.state.count("record:host") == 1


def test_explicit_addresses_inside_duplicate_outside_and_per_view(sim: WapiSimulator) -> None:
    """A literal address (what a requested address is posted as): accepted inside a network of the view, refused
    as a Client.Ibap.Data.Conflict when a fixed address already holds it there or when no network of the view
    encloses it; each network view is its own address space."""
    sim.state.add_network("2001:db8::/64")
    sim.state.add_network_view("lab")
    sim.state.add_network("10.0.0.0/24", network_view="lab")
    conn = sim.connector()
    made = ib.FixedAddress.create(conn, check_if_exists=False, ip="10.0.0.77", mac="00:00:00:00:00:00")
    assert made.ip == "10.0.0.77"
    six = ib.FixedAddress.create(conn, check_if_exists=False, ip="2001:db8::77", duid="00:04:01")
    assert six.ip == "2001:db8::77"
    for ip, identity in (("10.0.0.77", {"mac": "00:00:00:00:00:00"}), ("2001:db8::77", {"duid": "00:04:02"})):
        with pytest.raises(ib_ex.InfobloxCannotCreateObject) as failure:
            ib.FixedAddress.create(conn, check_if_exists=False, ip=ip, **identity)
        assert failure.value.response["code"] == "Client.Ibap.Data.Conflict"
        assert failure.value.response["Error"].startswith("AdmConDataError: None (IBDataConflictError:")
    other_view = ib.FixedAddress.create(
        conn, check_if_exists=False, network_view="lab", ip="10.0.0.77", mac="00:00:00:00:00:00"
    )
    assert other_view.network_view == "lab"
    with pytest.raises(ib_ex.InfobloxCannotCreateObject) as failure:
        ib.FixedAddress.create(conn, check_if_exists=False, ip="10.9.0.1", mac="00:00:00:00:00:00")
    assert failure.value.response["text"] == "The action is not allowed. A parent was not found."
    assert sim.state.count("fixedaddress") == 2 and sim.state.count("ipv6fixedaddress") == 1


def test_next_available_ip_function_reserves_nothing(sim: WapiSimulator) -> None:
    sim.state.add_fixed_address("10.0.0.2")
    conn = sim.connector()
    net_ref = sim.state.refs("network")[0]
    answer = conn.call_func("next_available_ip", net_ref, {"num": 3, "exclude": ["10.0.0.3"]})
    assert answer == {"ips": ["10.0.0.1", "10.0.0.4", "10.0.0.5"]}
    assert sim.state.used_addresses() == ["10.0.0.2"]


# -- create / read / update / delete ------------------------------------------------------------------------

CRUD_CASES = [
    ("networkview", {"name": "lab"}, "lab/false"),
    ("network", {"network": "10.1.0.0/24", "network_view": "default"}, "10.1.0.0/24/default"),
    ("ipv6network", {"network": "2001:db8:1::/64"}, "2001%3Adb8%3A1%3A%3A/64/default"),
    ("range", {"start_addr": "10.0.0.10", "end_addr": "10.0.0.20"}, "10.0.0.10/10.0.0.20/default"),
    ("extensibleattributedef", {"name": "Owner", "type": "STRING"}, "Owner"),
    ("fixedaddress", {"ipv4addr": "10.0.0.5", "mac": "aa:bb:cc:dd:ee:ff"}, "10.0.0.5/default"),
    ("ipv6fixedaddress", {"ipv6addr": "2001:db8::5", "duid": "00:01:02"}, "2001%3Adb8%3A%3A5/default"),
    (
        "record:host",
        {"name": "h1.example.com", "configure_for_dns": False, "ipv4addrs": [{"ipv4addr": "10.0.0.7"}]},
        "h1.example.com/%20",  # IPAM-only: the blank pseudo-view
    ),
]


@pytest.mark.parametrize(("obj_type", "body", "name_part"), CRUD_CASES, ids=[c[0] for c in CRUD_CASES])
def test_crud_each_object_type(sim: WapiSimulator, obj_type: str, body: dict[str, Any], name_part: str) -> None:
    sim.state.add_network("2001:db8::/64")
    conn = sim.connector()
    ref = conn.create_object(obj_type, body)
    match = REF.match(ref)
    assert match is not None and match.group("type") == obj_type and match.group("name") == name_part
    read = conn.get_object(ref, return_fields=list(body))
    assert read["_ref"] == ref
    for key, value in body.items():
        if key != "ipv4addrs":
            assert read[key] == value
    assert conn.update_object(ref, {"comment": "changed"}) == ref
    assert conn.get_object(ref, return_fields=["comment"]) == {"_ref": ref, "comment": "changed"}
    assert conn.get_object(obj_type, {}) != []
    assert conn.delete_object(ref) == ref
    gone = call(sim, "GET", ref)
    assert gone.status_code == 404
    assert gone.json() == {
        "Error": f"AdmConDataNotFoundError: Reference {ref} not found",
        "code": "Client.Ibap.Data.NotFound",
        "text": f"Reference {ref} not found",
    }


def test_update_that_changes_the_key_changes_the_ref(sim: WapiSimulator) -> None:
    conn = sim.connector()
    old = conn.create_object("fixedaddress", {"ipv4addr": "10.0.0.30", "mac": "aa:bb:cc:dd:ee:ff"})
    new = conn.update_object(old, {"ipv4addr": "func:nextavailableip:10.0.0.0/24,default"})
    assert new.endswith(":10.0.0.1/default") and new != old
    assert call(sim, "GET", old).status_code == 404
    assert sim.state.used_addresses() == ["10.0.0.1"]
    with pytest.raises(ib_ex.InfobloxCannotDeleteObject) as failure:
        conn.delete_object(old)
    assert failure.value.kwargs["code"] == 404


def test_client_get_of_unknown_ref_costs_four_requests(sim: WapiSimulator) -> None:
    conn = sim.connector()
    ref = conn.create_object("fixedaddress", {"ipv4addr": "10.0.0.30", "mac": "aa:bb:cc:dd:ee:ff"})
    conn.delete_object(ref)
    sim.request_log.reset()
    with pytest.raises(ib_ex.InfobloxConnectionError):
        conn.get_object(ref)
    entries = sim.request_log.entries
    assert [e.status for e in entries] == [404, 404, 404, 404]
    assert sum("_proxy_search=GM" in e.query for e in entries) == 2


# -- return fields, search, paging ----------------------------------------------------------------------------


def test_return_fields_default_explicit_plus_and_unknown(sim: WapiSimulator) -> None:
    default = call(sim, "GET", "network", params={"network": "10.0.0.0/24"}).json()
    assert default == [{"_ref": default[0]["_ref"], "network": "10.0.0.0/24", "network_view": "default"}]
    explicit = call(sim, "GET", "network", params={"_return_fields": "network_view"}).json()
    assert explicit == [{"_ref": default[0]["_ref"], "network_view": "default"}]
    plus = call(sim, "GET", "network", params={"_return_fields+": "extattrs,netmask"}).json()
    assert plus[0]["extattrs"] == {} and plus[0]["netmask"] == 24 and plus[0]["network"] == "10.0.0.0/24"
    unknown = call(sim, "GET", "network", params={"_return_fields": "network,bogus"})
    assert unknown.status_code == 400
    assert unknown.json() == {
        "Error": "AdmConProtoError: Unknown argument/field: 'bogus'",
        "code": "Client.Ibap.Proto",
        "text": "Unknown argument/field: 'bogus'",
    }
    as_object = call(sim, "GET", default[0]["_ref"], params={"_return_as_object": "1"}).json()
    assert as_object == {"result": default[0]}


def test_search_by_fields_and_empty_result(sim: WapiSimulator) -> None:
    sim.state.add_fixed_address("10.0.0.9", mac="aa:bb:cc:00:00:09")
    sim.state.add_host_record("db.example.com", ["10.0.0.10"])
    conn = sim.connector()
    found = conn.get_object("network", {"network": "10.0.0.0/24", "network_view": "default"})
    assert [n["network"] for n in found] == ["10.0.0.0/24"]
    assert conn.get_object("network", {"network": "10.0.1.0/24", "network_view": "default"}) == []
    assert call(sim, "GET", "fixedaddress", params={"ipv4addr": "10.0.0.99"}).json() == []
    assert [f["ipv4addr"] for f in conn.get_object("fixedaddress", {"mac": "aa:bb:cc:00:00:09"})] == ["10.0.0.9"]
    by_ip = ib.HostRecord.search(conn, ip="10.0.0.10")
    assert by_ip is not None and by_ip.name == "db.example.com"
    regex = call(sim, "GET", "record:host", params={"name~": "^db\\."}).json()
    assert [h["name"] for h in regex] == ["db.example.com"]
    not_searchable = call(sim, "GET", "fixedaddress", params={"disable": "false"})
    assert not_searchable.status_code == 400 and not_searchable.json()["text"] == "Field is not searchable: disable"


def test_extensible_attribute_search_and_writes(sim: WapiSimulator) -> None:
    conn = sim.connector()
    for claim in ("uid-a", "uid-b"):
        alloc_fixed(conn, extattrs=ib.EA({"Claim": claim}))
    found = ib.FixedAddress.search_all(conn, search_extattrs=ib.EA({"Claim": "uid-b"}))
    assert [f.ip for f in found] == ["10.0.0.2"]
    assert "%2AClaim=uid-b" in sim.request_log.entries[-1].query
    assert call(sim, "GET", "fixedaddress", params={"*Claim": "uid-zzz"}).json() == []
    undefined = call(sim, "GET", "fixedaddress", params={"*Ghost": "x"})
    assert undefined.status_code == 400
    assert undefined.json()["Error"] == "AdmConProtoError: Unknown extensible attribute: Ghost"
    write = call(sim, "POST", "network", json={"network": "10.5.0.0/24", "extattrs": {"Ghost": {"value": "x"}}})
    assert write.status_code == 400 and write.json()["code"] == "Client.Ibap.Proto"
    assert write.json()["text"] == "Unknown extensible attribute: Ghost"
    sim.state.add_ea_definition("Site")
    ref = found[0].ref
    conn.update_object(ref, {"extattrs+": {"Site": {"value": "fra"}}})
    conn.update_object(ref, {"extattrs-": {"Claim": {}}})
    assert sim.state.extattrs(ref) == {"Site": "fra"}


def test_paging_across_pages_through_the_client(wapi_simulator: WapiSimulator) -> None:
    for i in range(25):
        wapi_simulator.state.add_network(f"10.{i}.0.0/24")
    conn = wapi_simulator.connector(paging=True, max_results=10)
    found = conn.get_object("network", {"network_view": "default"})
    assert [n["network"] for n in found] == [f"10.{i}.0.0/24" for i in range(25)]
    queries = [e.query for e in wapi_simulator.request_log.entries]
    assert len(queries) == 3
    assert all("_paging=1" in q and "_return_as_object=1" in q and "_max_results=10" in q for q in queries)
    assert "_page_id=" not in queries[0] and all("_page_id=" in q for q in queries[1:])
    default_conn = wapi_simulator.connector(paging=True)
    assert len(default_conn.get_object("network")) == 25  # the client turns a missing/negative size into 1000


def test_paging_pages_and_errors_raw(wapi_simulator: WapiSimulator) -> None:
    for i in range(5):
        wapi_simulator.state.add_network(f"10.{i}.0.0/24")
    page_args = {"_paging": "1", "_return_as_object": "1", "_max_results": "2"}
    first = call(wapi_simulator, "GET", "network", params=page_args).json()
    assert [n["network"] for n in first["result"]] == ["10.0.0.0/24", "10.1.0.0/24"]
    second = call(wapi_simulator, "GET", "network", params={**page_args, "_page_id": first["next_page_id"]}).json()
    third = call(wapi_simulator, "GET", "network", params={**page_args, "_page_id": second["next_page_id"]}).json()
    assert [n["network"] for n in third["result"]] == ["10.4.0.0/24"] and "next_page_id" not in third
    bad_id = call(wapi_simulator, "GET", "network", params={**page_args, "_page_id": "nope"})
    assert bad_id.status_code == 400 and bad_id.json()["code"] == "Client.Ibap.Proto"
    no_object = call(wapi_simulator, "GET", "network", params={"_paging": "1", "_max_results": "2"})
    assert no_object.status_code == 400
    assert call(wapi_simulator, "GET", "network", params={"_return_as_object": "1"}).json()["result"][0]["network"] == (
        "10.0.0.0/24"
    )
    assert len(call(wapi_simulator, "GET", "network", params={"_max_results": "2"}).json()) == 2
    too_many = call(wapi_simulator, "GET", "network", params={"_max_results": "-3"})
    assert too_many.status_code == 400 and too_many.json()["text"] == "Result set too large (> 3)"


# -- malformed requests -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "code", "text"),
    [
        ("POST", "network", {"data": b"{not json"}, "Client.Ibap.Proto.JSONDecoding", None),
        (
            "POST",
            "network",
            {"json": {"network": "10.2.0.0/24", "bogus": 1}},
            "Client.Ibap.Proto",
            "Unknown argument/field: 'bogus'",
        ),
        ("GET", "bogus", {}, "Client.Ibap.Proto", "Unknown object type (bogus)"),
        ("POST", "network", {"json": {"comment": "x"}}, "Client.Ibap.Proto", "field for create missing: network"),
        (
            "POST",
            "network",
            {"json": {"network": "10.2.0.0/24", "comment": True}},
            "Client.Ibap.Proto",
            "Invalid value for comment: true: Must be string type",
        ),
        (
            "POST",
            "fixedaddress",
            {"json": {"ipv4addr": "10.0.0.3"}},
            "Client.Ibap.Proto",
            "field for create missing: mac",
        ),
        (
            "POST",
            "network",
            {"json": {"network": "10.0.0.0/24"}},
            "Client.Ibap.Data.Conflict",
            "The network 10.0.0.0/24 already exists.  Select another network.",
        ),
        ("GET", "network", {"params": {"_bogus": "1"}}, "Client.Ibap.Proto", "Unknown argument/field: '_bogus'"),
    ],
)
def test_malformed_and_conflicting_requests(
    sim: WapiSimulator, method: str, path: str, kwargs: dict[str, Any], code: str, text: str | None
) -> None:
    response = call(sim, method, path, **kwargs)
    assert response.status_code == 400
    assert response.json()["code"] == code
    if text is not None:
        assert response.json()["text"] == text
    assert sim.state.count("network") == 1


def test_create_only_fields_refuse_updates(sim: WapiSimulator) -> None:
    sim.state.add_network_view("other")
    ref = sim.state.refs("network")[0]
    response = call(sim, "PUT", ref, json={"network_view": "other"})
    assert response.status_code == 400
    assert response.json()["text"] == "Field is not allowed for update: network_view"


def test_wapi_versions_and_foreign_paths(sim: WapiSimulator) -> None:
    assert call(sim, "GET", "network").status_code == 200
    assert requests.get(sim.wapi_url("2.5") + "network", auth=("admin", "infoblox"), verify=str(sim.ca_path)).ok
    old = requests.get(sim.wapi_url("3.0") + "network", auth=("admin", "infoblox"), verify=str(sim.ca_path))
    assert old.status_code == 400 and old.json()["text"] == "Version 3.0 not supported"
    assert requests.get(sim.base_url + "/ui/", auth=("admin", "infoblox"), verify=str(sim.ca_path)).status_code == 404


def test_network_views_are_independent_and_cascade_on_delete(sim: WapiSimulator) -> None:
    view_ref = sim.state.add_network_view("blue")
    sim.state.add_network("10.0.0.0/24", network_view="blue")
    conn = sim.connector()
    assert alloc_fixed(conn, view="blue").ip == "10.0.0.1"
    assert alloc_fixed(conn).ip == "10.0.0.1"
    assert sorted(f["network_view"] for f in sim.state.objects("fixedaddress")) == ["blue", "default"]
    assert conn.get_object(view_ref, return_fields=["associated_dns_views"])["associated_dns_views"] == ["default.blue"]
    conn.delete_object(view_ref)
    assert [f["network_view"] for f in sim.state.objects("fixedaddress")] == ["default"]
    assert sim.state.count("network") == 1


def test_overlapping_networks_are_refused_within_a_view_only(sim: WapiSimulator) -> None:
    sim.state.add_network("10.0.2.0/24")
    for cidr, other in [
        ("10.0.0.0/16", "10.0.0.0/24"),  # encloses both: the first created is named
        ("10.0.0.128/25", "10.0.0.0/24"),
        ("10.0.2.0/30", "10.0.2.0/24"),
        ("10.0.2.0/23", "10.0.2.0/24"),
    ]:
        with pytest.raises(WapiError) as refused:
            sim.state.add_network(cidr)
        assert refused.value.text == f"The network {cidr} overlaps with the network {other}.", cidr
    sim.state.add_network("10.0.1.0/24")  # between the two, touching both
    sim.state.add_network("10.0.3.0/24")
    sim.state.add_network_view("blue")
    sim.state.add_network("10.0.0.0/16", network_view="blue")
    sim.state.delete(next(n["_ref"] for n in sim.state.objects("network") if n["network"] == "10.0.2.0/24"))
    sim.state.add_network("10.0.2.0/25")  # a deleted network no longer refuses its space
    sim.state.add_network("2001:db8::/64")
    with pytest.raises(WapiError):
        sim.state.add_network("2001:db8::/48")


# -- DNS views and authoritative zones -----------------------------------------------------------------------


def opaque(ref: str) -> str:
    """The decoded opaque part of a reference."""
    match = REF.match(ref)
    assert match is not None, ref
    encoded = match.group("opaque")
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()


def test_dns_views_and_zones_are_served_as_read_objects(sim: WapiSimulator) -> None:
    sim.state.add_network_view("blue")
    sim.state.add_dns_view("internal", comment="lab DNS")
    zone_ref = sim.state.add_zone("Example.COM.", "internal")
    sim.state.add_zone("nodes.example.com")
    conn = sim.connector()
    views = conn.get_object("view")
    assert [{k: v for k, v in view.items() if k != "_ref"} for view in views] == [
        {"name": "default", "is_default": True},
        {"name": "default.blue", "is_default": False},
        {"name": "internal", "is_default": False, "comment": "lab DNS"},
    ]
    assert [REF.match(v["_ref"]).group("name") for v in views] == [  # type: ignore[union-attr]
        "default/true",
        "default.blue/false",
        "internal/false",
    ]
    assert opaque(views[2]["_ref"]) == "dns.view$internal"
    (blue,) = conn.get_object("view", {"network_view": "blue"}, return_fields=["name", "network_view"])
    assert (blue["name"], blue["network_view"]) == ("default.blue", "blue")
    assert conn.get_object("view", {"name": "nope"}) == []
    plus = call(sim, "GET", "view", params={"name": "internal", "_return_fields+": "network_view"}).json()
    assert plus == [{**views[2], "network_view": "default"}]
    zones = conn.get_object("zone_auth", {"view": "internal"})
    assert zones == [{"_ref": zone_ref, "fqdn": "example.com", "view": "internal"}]
    assert REF.match(zone_ref).group("name") == "example.com/internal"  # type: ignore[union-attr]
    assert opaque(zone_ref) == "dns.zone$internal/example.com"
    assert conn.get_object(zone_ref, return_fields=["fqdn", "comment"]) == {"_ref": zone_ref, "fqdn": "example.com"}
    by_regex = conn.get_object("zone_auth", {"fqdn~": "^(nodes[.]example[.]com|example[.]com)$", "view": "default"})
    assert [z["fqdn"] for z in by_regex] == ["nodes.example.com"]
    page_args = {"_paging": "1", "_return_as_object": "1", "_max_results": "1"}
    first = call(sim, "GET", "zone_auth", params=page_args).json()
    second = call(sim, "GET", "zone_auth", params={**page_args, "_page_id": first["next_page_id"]}).json()
    assert [z["fqdn"] for z in first["result"] + second["result"]] == ["example.com", "nodes.example.com"]
    assert "next_page_id" not in second
    unknown = call(sim, "GET", "zone_auth", params={"_return_fields": "network_view"})
    assert unknown.status_code == 400 and unknown.json()["text"] == "Unknown argument/field: 'network_view'"


def test_dns_views_and_zones_are_read_only_over_wapi(sim: WapiSimulator) -> None:
    zone_ref = sim.state.add_zone("example.com")
    view_ref = sim.state.refs("view")[0]
    cases: list[tuple[str, str, dict[str, Any], str, str]] = [
        ("POST", "view", {"json": {"name": "new"}}, "create", "view"),
        ("POST", "zone_auth", {"json": {"fqdn": "new.example.com"}}, "create", "zone_auth"),
        ("PUT", zone_ref, {"json": {"comment": "x"}}, "update", "zone_auth"),
        ("DELETE", view_ref, {}, "delete", "view"),
        ("DELETE", zone_ref, {}, "delete", "zone_auth"),
    ]
    for method, path, kwargs, operation, obj_type in cases:
        response = call(sim, method, path, **kwargs)
        assert response.status_code == 400
        assert response.json() == {
            "Error": f"AdmConProtoError: Operation {operation} not allowed for {obj_type}",
            "code": "Client.Ibap.Proto",
            "text": f"Operation {operation} not allowed for {obj_type}",
        }
    with pytest.raises(ib_ex.InfobloxCannotCreateObject):
        sim.connector().create_object("zone_auth", {"fqdn": "other.example.com"})
    assert sim.state.count("view") == 1 and sim.state.count("zone_auth") == 1


def test_dns_view_and_zone_rules_and_cascades(sim: WapiSimulator) -> None:
    with pytest.raises(WapiError, match="Network view nope not found"):
        sim.state.add_dns_view("lab", network_view="nope")
    with pytest.raises(WapiError, match="View nope not found"):
        sim.state.add_zone("example.com", "nope")
    sim.state.add_network_view("blue")
    sim.state.add_network("10.0.0.0/24", network_view="blue")
    sim.state.add_dns_view("lab", network_view="blue")
    zone = sim.state.add_zone("lab.example.com", "lab")
    with pytest.raises(WapiError, match=r"Duplicate object 'lab\.example\.com' of type zone"):
        sim.state.add_zone("LAB.example.com", "lab")
    with pytest.raises(WapiError, match="The default DNS view cannot be deleted"):
        sim.state.delete(sim.state.refs("view")[0])
    host: dict[str, Any] = {"view": "lab", "configure_for_dns": True}
    sim.state.add_host_record("a.lab.example.com", "func:nextavailableip:10.0.0.0/24,blue", **host)
    assert sim.state.find("record:host", name="a.lab.example.com")[0]["zone"] == "lab.example.com"
    sim.state.delete(zone)  # the records of a zone go with it
    assert sim.state.count("record:host") == 0
    sim.state.add_zone("lab.example.com", "lab")
    sim.state.add_host_record("b.lab.example.com", "func:nextavailableip:10.0.0.0/24,blue", **host)
    conn = sim.connector()
    (blue,) = conn.get_object("networkview", {"name": "blue"}, return_fields=["associated_dns_views"])
    assert blue["associated_dns_views"] == ["default.blue", "lab"]
    conn.delete_object(blue["_ref"])  # a network view takes its DNS views, their zones and records along
    assert [v["name"] for v in sim.state.objects("view")] == ["default"]
    assert sim.state.count("zone_auth") == 0 and sim.state.count("record:host") == 0


# -- authentication and TLS ---------------------------------------------------------------------------------


def test_bad_credentials_answer_401(sim: WapiSimulator) -> None:
    response = call(sim, "GET", "network", auth=("admin", "wrong"))
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Basic ")
    assert "ibapauth" not in response.cookies
    conn = sim.connector(password="wrong")
    with pytest.raises(ib_ex.InfobloxBadWAPICredential):
        conn.get_object("network")
    assert [e.status for e in sim.request_log.entries[1:]] == [401, 401]  # the client retries once
    assert call(sim, "GET", "network", auth=None).status_code == 401


def test_cookie_authentication(sim: WapiSimulator) -> None:
    first = call(sim, "GET", "network")
    cookie = first.cookies["ibapauth"]
    fields = dict(part.split("=", 1) for part in cookie.strip('"').split(",") if "=" in part)
    assert fields["user"] == "admin" and fields["timeout"] == "600" and abs(int(fields["ctime"]) - time.time()) < 60
    cookie_only = requests.get(sim.url + "network", cookies={"ibapauth": cookie}, verify=str(sim.ca_path))
    assert cookie_only.status_code == 200 and "set-cookie" not in {k.lower() for k in cookie_only.headers}
    bogus = requests.get(sim.url + "network", cookies={"ibapauth": '"ip=1,user=admin,forged"'}, verify=str(sim.ca_path))
    assert bogus.status_code == 401
    conn = sim.connector()
    sim.request_log.reset()
    for _ in range(3):
        conn.get_object("network")
    assert [e.auth for e in sim.request_log.entries] == ["basic", "cookie", "cookie"]
    sim.auth.expire_sessions()
    sim.request_log.reset()
    assert conn.get_object("network") != []
    assert [(e.status, e.auth) for e in sim.request_log.entries] == [(401, "cookie"), (200, "basic")]


def test_expired_sessions_are_pruned_when_sessions_are_made() -> None:
    now = [1000.0]
    auth = Authenticator({"admin": "pw"}, session_timeout=600, clock=lambda: now[0])
    basic = "Basic " + base64.b64encode(b"admin:pw").decode()

    def login() -> str:
        result = auth.authenticate(basic, None, "127.0.0.1")
        assert result.ok and result.set_cookie is not None
        return "ibapauth=" + result.set_cookie.split("ibapauth=", 1)[1].split(";", 1)[0]

    kept = login()
    for _ in range(99):
        login()
    assert auth.session_count == 100, "live sessions are kept"
    now[0] += 300
    assert auth.authenticate(None, kept, "127.0.0.1").ok  # used: it lives 600 s from now
    now[0] += 301  # the 99 others are 601 s old, the kept one 301 s
    login()
    assert auth.session_count == 2, "the expired sessions went when a new one was made"
    assert auth.authenticate(None, kept, "127.0.0.1").method == "cookie"
    assert auth.authenticate(None, kept, "127.0.0.1").ok


def test_tls_requires_the_simulator_ca(sim: WapiSimulator, tmp_path: Path) -> None:
    assert sim.connector().get_object("network") != []
    with pytest.raises(ib_ex.InfobloxConnectionError):
        sim.connector(ssl_verify=True).get_object("network")
    other_ca = make_tls_material(tmp_path / "other").ca_path
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(sim.url + "network", auth=("admin", "infoblox"), verify=str(other_ca), timeout=10)
    assert all(e.status == 200 for e in sim.request_log.entries)


# -- fault injection ----------------------------------------------------------------------------------------


def test_503_on_post_is_not_retried_and_creates_nothing(sim: WapiSimulator) -> None:
    sim.faults.fail_next(1, methods="POST", object_types="fixedaddress")
    conn = sim.connector()
    with pytest.raises(ib_ex.InfobloxCannotCreateObject) as failure:
        alloc_fixed(conn)
    assert failure.value.kwargs["code"] == 503
    assert sim.state.count("fixedaddress") == 0
    assert alloc_fixed(conn).ip == "10.0.0.1"
    assert [e.status for e in sim.request_log.entries] == [503, 201]


def test_503_on_get_put_delete(sim: WapiSimulator) -> None:
    conn = sim.connector()
    ref = conn.create_object("fixedaddress", {"ipv4addr": "10.0.0.40", "mac": "aa:bb:cc:dd:ee:ff"})
    sim.faults.fail_next(1, methods="GET")
    assert len(conn.get_object("fixedaddress")) == 1  # retried once by the client, with _proxy_search=GM
    assert [e.status for e in sim.request_log.entries[-2:]] == [503, 200]
    sim.faults.fail_next(1, methods=["PUT", "DELETE"])
    sim.faults.fail_next(1, methods="DELETE")
    with pytest.raises(ib_ex.InfobloxGridTemporaryUnavailable):
        conn.update_object(ref, {"comment": "x"})
    with pytest.raises(ib_ex.InfobloxGridTemporaryUnavailable):
        conn.delete_object(ref)
    assert sim.state.count("fixedaddress") == 1


def test_503_rate_is_seeded_and_selects_by_object_type(wapi_simulator_factory: Any) -> None:
    outcomes = []
    for _ in range(2):
        simulator = wapi_simulator_factory(seed=7)
        simulator.state.add_network("10.0.0.0/24")
        rule = simulator.faults.fail_rate(0.5, object_types="network")
        with requests.Session() as session:
            statuses = [call(simulator, "GET", "network", session).status_code for _ in range(20)]
        assert call(simulator, "GET", "fixedaddress").status_code == 200
        assert rule.fired == statuses.count(503) and 0 < rule.fired < 20
        outcomes.append(statuses)
    assert outcomes[0] == outcomes[1]


def test_latency_and_client_timeout(sim: WapiSimulator) -> None:
    sim.faults.add_latency(0.2, methods="GET", count=1)
    started = time.monotonic()
    assert call(sim, "GET", "network").status_code == 200
    assert time.monotonic() - started >= 0.2
    sim.faults.add_latency(0.6, methods="POST", count=1)
    conn = sim.connector(http_request_timeout=0.3)
    with pytest.raises(ib_ex.InfobloxTimeoutError):
        alloc_fixed(conn)
    deadline = time.monotonic() + 5
    while sim.state.count("fixedaddress") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.state.used_addresses() == ["10.0.0.1"]  # the server still committed after the client gave up


def test_dropped_connections(sim: WapiSimulator) -> None:
    conn = sim.connector()
    sim.faults.drop_next(1, methods="POST")
    with pytest.raises(ib_ex.InfobloxConnectionError):
        alloc_fixed(conn)
    assert sim.state.count("fixedaddress") == 0
    assert [(e.method, e.status, e.fault) for e in sim.request_log.entries] == [("POST", None, "drop")]
    sim.faults.drop_next(1, methods="GET")
    assert conn.get_object("network") != []  # urllib3 retries an idempotent request on its own
    assert [(e.status, e.fault) for e in sim.request_log.entries[-2:]] == [(None, "drop"), (200, None)]


def test_drop_reply_after_commit_and_recovery_by_ea_search(sim: WapiSimulator) -> None:
    conn = sim.connector()
    sim.faults.drop_reply_after_commit(1, methods="POST", object_types="fixedaddress")
    with pytest.raises(ib_ex.InfobloxConnectionError):
        alloc_fixed(conn, extattrs=ib.EA({"Claim": "uid-lost"}))
    assert sim.state.used_addresses() == ["10.0.0.1"]
    assert sim.request_log.count("POST", "fixedaddress") == 1  # a POST is never retried
    recovered = ib.FixedAddress.search_all(conn, search_extattrs=ib.EA({"Claim": "uid-lost"}))
    assert [f.ip for f in recovered] == ["10.0.0.1"]
    sim.faults.drop_reply_after_commit(1, methods="DELETE")
    with pytest.raises(ib_ex.InfobloxCannotDeleteObject) as failure:
        conn.delete_object(recovered[0].ref)
    assert failure.value.kwargs["code"] == 404  # urllib3 re-sent the DELETE; the object was already gone
    assert sim.state.count("fixedaddress") == 0


def test_faults_reject_unknown_kinds(sim: WapiSimulator) -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        sim.faults.add("explode")
    sim.faults.fail_next(5)
    sim.faults.clear()
    assert call(sim, "GET", "network").status_code == 200


def test_a_removed_rule_fires_no_more(sim: WapiSimulator) -> None:
    first, second = sim.faults.fail_next(2, methods="GET"), sim.faults.fail_next(5)
    assert call(sim, "GET", "network").status_code == 503
    assert sim.faults.remove(first) == 1, "one of its two uses was left"
    assert call(sim, "GET", "network").status_code == 503  # the second rule now
    assert sim.faults.remove(second) == 4 and sim.faults.rules == []
    assert call(sim, "GET", "network").status_code == 200
    assert (first.fired, second.fired) == (1, 1)


# -- concurrency and the command --------------------------------------------------------------------------


def test_100_concurrent_allocations_are_unique(sim: WapiSimulator) -> None:
    conn = sim.connector()
    barrier = threading.Barrier(100)

    def allocate(i: int) -> str:
        barrier.wait(timeout=30)
        return str(alloc_fixed(conn, extattrs=ib.EA({"Claim": f"uid-{i}"})).ip)

    with ThreadPoolExecutor(max_workers=100) as pool:
        addresses = list(pool.map(allocate, range(100)))
    assert sorted(addresses, key=lambda a: int(a.rsplit(".", 1)[1])) == [f"10.0.0.{i}" for i in range(1, 101)]
    assert sim.request_log.counts() == {("POST", "fixedaddress"): 100}
    assert sim.state.count("fixedaddress") == 100


def test_command_line_serves_seeded_networks() -> None:
    command = [
        sys.executable,
        "-m",
        "tools.wapi_simulator",
        "--no-tls",
        "--seed-network",
        "10.3.0.0/24",
        "--seed-ea",
        "Claim",
    ]
    root = Path(__file__).resolve().parents[3]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = line.rsplit(" ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/wapi/v2.12/")
        response = requests.get(url + "network", auth=("admin", "infoblox"), timeout=10)
        assert [n["network"] for n in response.json()] == ["10.3.0.0/24"]
        eas = requests.get(url + "extensibleattributedef", auth=("admin", "infoblox"), timeout=10).json()
        assert [e["name"] for e in eas] == ["Claim"]
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


def test_check_if_exists_with_a_func_address_fails_before_posting(sim: WapiSimulator) -> None:
    conn = sim.connector()
    with pytest.raises(ib_ex.InfobloxConnectionError):
        ib.FixedAddress.create(
            conn,
            check_if_exists=True,
            mac="00:00:00:00:00:00",
            ip=ib.IPAllocation.next_available_ip_from_cidr("default", "10.0.0.0/24"),
        )
    assert [(e.method, e.status) for e in sim.request_log.entries] == [("GET", 400)] * 4
    refused = call(sim, "GET", "fixedaddress", params={"ipv4addr": "func:nextavailableip:10.0.0.0/24,default"})
    assert refused.json()["code"] == "Client.Ibap.Proto"
    assert refused.json()["text"].startswith("Invalid value for ipv4addr: ")


def test_host_record_address_list_modifiers(sim: WapiSimulator) -> None:
    conn = sim.connector()
    ref = sim.state.add_host_record("multi.example.com", ["10.0.0.5"], aliases=["m.example.com"])
    added = conn.update_object(
        ref, {"ipv4addrs+": [{"ipv4addr": "func:nextavailableip:10.0.0.0/24,default"}]}, return_fields=["ipv4addrs"]
    )
    assert [e["ipv4addr"] for e in added["ipv4addrs"]] == ["10.0.0.5", "10.0.0.1"]
    conn.update_object(ref, {"ipv4addrs-": [{"ipv4addr": "10.0.0.5"}], "aliases+": ["n.example.com"]})
    host = sim.state.get(ref)
    assert host is not None
    assert [e["ipv4addr"] for e in host["ipv4addrs"]] == ["10.0.0.1"]
    assert host["aliases"] == ["m.example.com", "n.example.com"]
    assert sim.state.used_addresses() == ["10.0.0.1"]
    emptied = call(sim, "PUT", ref, json={"ipv4addrs": []})
    assert emptied.status_code == 400 and emptied.json()["text"] == "field for create missing: ipv4addrs"


def test_client_fetch_then_update_round_trip(sim: WapiSimulator) -> None:
    sim.state.add_network_view("blue")
    sim.state.add_network("10.0.0.0/24", network_view="blue")
    conn = sim.connector()
    fixed = alloc_fixed(conn, extattrs=ib.EA({"Claim": "uid-u"}))
    found = ib.FixedAddress.search(conn, ip="10.0.0.1", network_view="default")
    assert found is not None and found.ref == fixed.ref
    found.comment = "moved"
    found.network_view = "blue"  # updatable on fixedaddress (infoblox-client sends it on every update anyway)
    updated = found.update()
    assert updated.ref.endswith(":10.0.0.1/blue") and updated.network_view == "blue"
    assert sim.state.used_addresses("blue") == ["10.0.0.1"] and sim.state.used_addresses() == []
    assert sim.state.get(updated.ref)["comment"] == "moved"  # type: ignore[index]
    put = sim.request_log.entries[-1]
    assert put.method == "PUT" and put.is_ref
    assert put.json() == {
        "comment": "moved",
        "extattrs": {"Claim": {"value": "uid-u"}},
        "ipv4addr": "10.0.0.1",
        "mac": "00:00:00:00:00:00",
        "network_view": "blue",
    }
