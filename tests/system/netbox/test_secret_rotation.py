"""A NetBox token rotated in the pool's Secret, end to end (real API server, real controller, real NetBox): the new
token is used from then on without a restart, even once the old one is revoked in NetBox; a wrong one is reported
on the pool (its condition and a Warning Event) and its claims, and no token ever shows in a log line, a condition
or an Event."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
import requests
import structlog

from backends.netbox.spec import CLAIM_REF_FIELD, CLAIM_UID_FIELD, CLUSTER_IDENTITY_FIELD, OWNER_TAG
from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS, SECRETS
from tests.support.netbox_backend import (
    NB_POOLS,
    READ_TYPES,
    create_secret,
    get_or_create_field,
    get_or_create_tag,
    nb_claim,
    netbox_pool,
    prefix,
    unique_name,
    wait_pool_reason,
)
from tests.support.objects import wait_address, wait_claim_reason, wait_events

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


def new_token(netbox: NetBoxServer, user_id: int) -> tuple[str, int]:
    """A v2 token of the user, and its id in NetBox (to revoke it)."""
    answer = requests.post(
        f"{netbox.url}/api/users/tokens/",
        headers={"Authorization": f"Bearer {netbox.token}"},
        json={"user": user_id, "write_enabled": True, "version": 2},
        timeout=30,
    )
    answer.raise_for_status()
    body = answer.json()
    return f"nbt_{body['key']}.{body['token']}", int(body["id"])


def revoke(netbox: NetBoxServer, token_id: int) -> None:
    answer = requests.delete(
        f"{netbox.url}/api/users/tokens/{token_id}/", headers={"Authorization": f"Bearer {netbox.token}"}, timeout=30
    )
    answer.raise_for_status()


def provider_user(netbox: NetBoxServer) -> int:
    """A NetBox user with what the provider needs on pools whose ownership tag and field exist."""
    get_or_create_tag(netbox, OWNER_TAG)
    get_or_create_field(netbox, CLAIM_UID_FIELD, unique=True, filter_logic="exact")
    get_or_create_field(netbox, CLAIM_REF_FIELD)
    get_or_create_field(netbox, CLUSTER_IDENTITY_FIELD)
    api = netbox.api()
    username = unique_name("rotated")
    user = api.users.users.create(username=username, password="A-long-test-password-1")
    api.users.permissions.create(
        name=f"{username}-view", object_types=list(READ_TYPES), actions=["view"], users=[user.id]
    )
    api.users.permissions.create(
        name=f"{username}-write", object_types=["ipam.ipaddress"], actions=["add", "change", "delete"], users=[user.id]
    )
    return int(user.id)


async def shown(kube: KubeClient, namespace: str, controller: Any) -> list[str]:
    """What the cluster shows of the namespace: the pool's and claims' statuses and every Event."""
    await controller.context.recorder.flush()
    pools, _ = await kube.list(NB_POOLS, namespace)
    claims, _ = await kube.list(CLAIMS, namespace)
    events, _ = await kube.list(EVENTS, namespace)
    return [*(str(o.get("status")) for o in [*pools, *claims]), *(str(e) for e in events)]


async def test_a_rotated_token_is_used_at_once_and_a_wrong_one_is_reported_not_logged(
    kube: KubeClient,
    namespace: str,
    netbox: NetBoxServer,
    netbox_controller: Any,
    fast_pool_resync: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    netbox.create_prefix("10.197.0.0/28")
    user = provider_user(netbox)
    first, first_id = new_token(netbox, user)
    await create_secret(kube, namespace, netbox, token=first)
    await kube.create(NB_POOLS, netbox_pool("rotated", [prefix("10.197.0.0/28")]), namespace)
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        async with netbox_controller() as controller:
            await kube.create(CLAIMS, nb_claim("before", "rotated"), namespace)
            assert (await wait_address(kube, namespace, "before"))["spec"]["address"] == "10.197.0.1"

            second, _ = new_token(netbox, user)
            await kube.patch(SECRETS, "netbox", {"stringData": {"token": second}}, namespace)
            revoke(netbox, first_id)  # from now on only the new token works
            await kube.create(CLAIMS, nb_claim("after", "rotated"), namespace)
            assert (await wait_address(kube, namespace, "after", timeout=60))["spec"]["address"] == "10.197.0.2"
            await wait_pool_reason(kube, namespace, "rotated", "PoolReady")

            wrong = second[:-6] + ("abcdef" if not second.endswith("abcdef") else "fedcba")
            await kube.patch(SECRETS, "netbox", {"stringData": {"token": wrong}}, namespace)
            pool = await wait_pool_reason(kube, namespace, "rotated", "AuthenticationFailed", timeout=60)
            await kube.create(CLAIMS, nb_claim("refused", "rotated"), namespace)
            await wait_claim_reason(kube, namespace, "refused", "PoolNotReady", timeout=60)
            failed = await wait_events(
                kube,
                namespace,
                controller.context.recorder,
                lambda e: (e.get("type"), e.get("reason")) == ("Warning", "AuthenticationFailed"),
                "an AuthenticationFailed Warning Event",
            )
            assert {e["involvedObject"]["name"] for e in failed} == {"rotated"}, failed
            texts = await shown(kube, namespace, controller)
            assert "token" in pool["status"]["conditions"][0]["message"]

            await kube.patch(SECRETS, "netbox", {"stringData": {"token": second}}, namespace)  # fixed
            assert (await wait_address(kube, namespace, "refused", timeout=60))["spec"]["address"] == "10.197.0.3"
    logged = [repr(entry) for entry in logs] + [record.getMessage() for record in caplog.records] + [caplog.text]
    assert any("AuthenticationFailed" in line or "authentication" in line.lower() for line in logged)
    for token in (first, second, wrong):
        for secret in (token, token.split(".")[-1]):
            assert not [text for text in [*logged, *texts] if secret in text], "a token was shown"
