"""Checks the real-NetBox harness (tests/support/netbox.py) and the NetBox behaviour the backend relies on.

Every test talks to a real NetBox through pynetbox or plain HTTP; nothing is mocked. Tests in this module
share one database (the ``netbox`` fixture resets it per module), so each uses its own prefixes and names.
"""

from __future__ import annotations

import http.client
import os
import select
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pynetbox
import pytest
import requests

if TYPE_CHECKING:
    # Only for annotations: importing it here at run time would import the plugin before pytest can
    # rewrite its asserts.
    from tests.support.netbox import NetBoxServer

# Harmless when tests/conftest.py already lists it: pytest loads a plugin once.
pytest_plugins = ["tests.support.netbox"]

REPO_ROOT = Path(__file__).resolve().parents[3]


def _addresses(records: object) -> list[str]:
    return [record.address for record in records]  # type: ignore[attr-defined]


def test_module_starts_with_an_empty_database(netbox: NetBoxServer) -> None:
    netbox.require_harness("an empty database per module (reset_database())")
    api = netbox.api()
    assert api.ipam.prefixes.count() == 0
    assert api.ipam.ip_addresses.count() == 0
    assert api.ipam.ip_ranges.count() == 0
    assert api.tenancy.tenants.count() == 0
    assert api.extras.tags.count() == 0
    assert api.extras.custom_fields.count() == 0
    assert netbox.last_reset_s is not None and netbox.last_reset_s < 10


def test_v2_token_bearer_auth(netbox: NetBoxServer) -> None:
    assert netbox.token.startswith("nbt_")
    key, _, secret = netbox.token.removeprefix("nbt_").partition(".")
    assert len(key) == 12 and len(secret) == 40

    status = netbox.status()
    assert status["netbox-version"].startswith(netbox.pinned_version)
    assert netbox.api().status()["netbox-version"].startswith(netbox.pinned_version)

    wrong = requests.get(
        f"{netbox.url}/api/status/",
        headers={"Authorization": f"Bearer nbt_{key}.{'x' * 40}"},
        timeout=10,
    )
    assert wrong.status_code == 403
    anonymous = requests.get(f"{netbox.url}/api/ipam/prefixes/", timeout=10)
    assert anonymous.status_code == 403


# Longer than gunicorn's default keep-alive (2 s) plus the second its workers may take to act on it.
KEEP_ALIVE_PROBE_S = 4.0


def test_an_idle_keep_alive_connection_stays_open(netbox: NetBoxServer) -> None:
    """The harness's gunicorn never closes an idle connection (hack/netbox/web.sh: --keep-alive 3600).

    A server that does races with a client reusing the connection just then: the request meets the close and the
    client gets ConnectionResetError although NetBox was fine (tests/tools/test_netbox_sessions.py shows how).
    """
    netbox.require_harness("gunicorn's keep-alive (hack/netbox/web.sh)")
    url = urlsplit(netbox.url)
    headers = {"Authorization": f"Bearer {netbox.token}", "Accept": "application/json"}
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        connection.request("GET", "/api/status/", headers=headers)
        first = connection.getresponse()
        first.read()
        assert first.status == 200
        assert (first.getheader("Connection") or "").lower() != "close", "NetBox does not keep connections open"
        sock = connection.sock
        assert sock is not None
        time.sleep(KEEP_ALIVE_PROBE_S)
        closed, _, _ = select.select([sock], [], [], 0)  # readable while idle: the server closed it
        assert not closed, f"NetBox closed a keep-alive connection idle for {KEEP_ALIVE_PROBE_S:g} s"
        connection.request("GET", "/api/status/", headers=headers)
        second = connection.getresponse()
        second.read()
        assert second.status == 200 and connection.sock is sock
    finally:
        connection.close()


def test_available_ips_gives_the_lowest_free_address(netbox: NetBoxServer) -> None:
    api = netbox.api()
    prefix = netbox.create_prefix("10.10.0.0/24")
    api.ipam.ip_addresses.create(address="10.10.0.1/24")
    api.ipam.ip_addresses.create(address="10.10.0.3/24")

    first = prefix.available_ips.create({"description": "first"})
    second = prefix.available_ips.create({"description": "second"})
    third = prefix.available_ips.create({"description": "third"})

    assert [first.address, second.address, third.address] == ["10.10.0.2/24", "10.10.0.4/24", "10.10.0.5/24"]
    assert api.ipam.ip_addresses.get(address="10.10.0.2/24").description == "first"


def test_exhaustion_raises_allocation_error(netbox: NetBoxServer) -> None:
    prefix = netbox.create_prefix("10.11.0.0/29")
    allocated = [prefix.available_ips.create({}).address for _ in range(6)]
    assert allocated == [f"10.11.0.{host}/29" for host in range(1, 7)]

    with pytest.raises(pynetbox.AllocationError):
        prefix.available_ips.create({})

    # A bulk request for more than remains also answers 409, and creates nothing.
    other = netbox.create_prefix("10.11.1.0/29")
    other.available_ips.create([{} for _ in range(4)])
    with pytest.raises(pynetbox.AllocationError):
        other.available_ips.create([{} for _ in range(3)])
    assert netbox.api().ipam.ip_addresses.count(parent="10.11.1.0/29") == 4


def test_delete_then_reallocate_reuses_the_address(netbox: NetBoxServer) -> None:
    prefix = netbox.create_prefix("10.12.0.0/28")
    records = [prefix.available_ips.create({}) for _ in range(3)]
    assert _addresses(records) == ["10.12.0.1/28", "10.12.0.2/28", "10.12.0.3/28"]

    assert records[1].delete() is True
    again = prefix.available_ips.create({})
    assert again.address == "10.12.0.2/28"
    assert again.id != records[1].id


def test_ip_range_allocation_and_exhaustion(netbox: NetBoxServer) -> None:
    ip_range = netbox.create_ip_range("10.13.0.10/24", "10.13.0.12/24")
    addresses = [ip_range.available_ips.create({}).address for _ in range(3)]
    assert addresses == ["10.13.0.10/24", "10.13.0.11/24", "10.13.0.12/24"]
    with pytest.raises(pynetbox.AllocationError):
        ip_range.available_ips.create({})


def test_ownership_marks_tenant_tag_custom_field(netbox: NetBoxServer) -> None:
    tenant = netbox.create_tenant(f"Cluster A {uuid.uuid4().hex[:8]}")
    tag = netbox.api().extras.tags.get(slug="capi-ipam") or netbox.create_tag("capi-ipam")  # a shared NetBox has it
    if netbox.api().extras.custom_fields.get(name="capi_claim") is None:
        netbox.create_custom_field("capi_claim")
    prefix = netbox.create_prefix("10.14.0.0/24", tenant=tenant, tags=[tag.slug])
    assert prefix.tenant.id == tenant.id
    assert [t.slug for t in prefix.tags] == ["capi-ipam"]

    mine = prefix.available_ips.create(
        {"tenant": tenant.id, "tags": [{"slug": tag.slug}], "custom_fields": {"capi_claim": "ns/claim-1"}}
    )
    prefix.available_ips.create({"description": "someone else's"})

    api = netbox.api()
    found = list(api.ipam.ip_addresses.filter(tag="capi-ipam", cf_capi_claim="ns/claim-1"))
    assert _addresses(found) == [mine.address] == ["10.14.0.1/24"]
    assert found[0].tenant.id == tenant.id
    assert api.ipam.ip_addresses.count(tenant_id=tenant.id) == 1


def test_reset_database_gives_a_clean_slate_under_a_running_server(netbox: NetBoxServer) -> None:
    netbox.require_harness("reset_database()")
    netbox.create_tag("before-reset")
    netbox.create_custom_field("before_reset")
    netbox.create_prefix("10.15.0.0/24").available_ips.create({})

    seconds = netbox.reset_database()

    api = netbox.api()
    assert api.extras.tags.count() == 0
    assert api.extras.custom_fields.count() == 0
    assert api.ipam.prefixes.count() == 0
    assert api.ipam.ip_addresses.count() == 0
    assert seconds < 10
    # The same names can be created again: nothing lingers in a cache.
    netbox.create_tag("before-reset")
    netbox.create_custom_field("before_reset")


def test_module_fixture_isolates_modules(netbox: NetBoxServer, tmp_path: Path) -> None:
    """Runs two throw-away test modules in a child pytest against this same NetBox.

    The first fills NetBox; the second must see none of it. The child borrows the server (NETBOX_URL,
    NETBOX_TOKEN, NETBOX_RUN_DIR), so it neither starts nor stops one.
    """
    run_dir = netbox.require_harness("the per-module reset")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.netbox"]\n')
    (tmp_path / "test_a_fill.py").write_text(
        textwrap.dedent(
            """
            def test_fill(netbox):
                netbox.create_tag("leak")
                netbox.create_custom_field("leak")
                netbox.create_tenant("leak")
                netbox.create_prefix("10.99.0.0/24").available_ips.create({})
                assert netbox.api().ipam.ip_addresses.count() == 1
            """
        )
    )
    (tmp_path / "test_b_check.py").write_text(
        textwrap.dedent(
            """
            def test_clean(netbox):
                api = netbox.api()
                counts = {
                    "tags": api.extras.tags.count(),
                    "custom_fields": api.extras.custom_fields.count(),
                    "tenants": api.tenancy.tenants.count(),
                    "prefixes": api.ipam.prefixes.count(),
                    "ip_addresses": api.ipam.ip_addresses.count(),
                }
                assert counts == dict.fromkeys(counts, 0)
            """
        )
    )
    env = {
        **os.environ,
        "NETBOX_URL": netbox.url,
        "NETBOX_TOKEN": netbox.token,
        "NETBOX_RUN_DIR": str(run_dir),
        "PYTHONPATH": str(REPO_ROOT),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    child = subprocess.run(
        [*command, "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert "2 passed" in child.stdout


async def test_stop_web_then_start_web(netbox: NetBoxServer) -> None:
    netbox.require_harness("stopping and starting NetBox")
    prefix = netbox.create_prefix("10.16.0.0/24")
    kept = prefix.available_ips.create({})
    url = netbox.url

    await netbox.stop_web()
    assert not netbox.web_running()
    assert not netbox.is_serving()
    with pytest.raises(requests.ConnectionError):
        netbox.api().ipam.prefixes.count()

    await netbox.start_web()
    assert netbox.url == url
    assert netbox.web_running()
    api = netbox.api()
    assert api.ipam.ip_addresses.get(kept.id).address == kept.address
    assert prefix.available_ips.create({}).address == "10.16.0.2/24"

    # kill=True: SIGKILL to every gunicorn process, like a crash; the data survives that too.
    await netbox.stop_web(kill=True)
    assert not netbox.web_running()
    with pytest.raises(requests.ConnectionError):
        netbox.api().ipam.prefixes.count()
    await netbox.start_web()
    assert prefix.available_ips.create({}).address == "10.16.0.3/24"
