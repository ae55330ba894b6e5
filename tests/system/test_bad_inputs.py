"""The bad-input corpus (tests/system/bad_inputs, described by its index.yaml), applied against the real API server with
the CRDs installed and the provider's admission webhook registered, and the controller serving every backend
(in-cluster address and prefix pools, NetBox, Infoblox).

Each case is either refused, with a message naming the field, or accepted and surfaced by the controller as a
condition and an Event naming the field. A good pool created before the corpus must still serve a claim after
every bad input was applied: one bad object never stops the controller nor the other pools.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.client import RetryPolicy
from backends.infoblox.settings import InfobloxSettings
from backends.infoblox.spec import INFOBLOX_POOL, INSTANCES
from backends.netbox import NetboxBackend, NetboxSettings
from backends.netbox.client import ClientSettings
from backends.netbox.spec import GLOBAL_NETBOX_POOL, NETBOX_POOL
from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import BackendContext
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.common import Object
from ipam_provider.reconcile.context import pool_resource
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS, NAMESPACES, SECRETS
from tests.ipam_provider.test_admission import labelled, webhook
from tests.support.objects import GLOBAL_POOLS, GLOBAL_PREFIX_POOLS, POOLS, PREFIX_POOLS, claim, pool, wait_address

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
RESOURCES = {
    resource.kind: resource
    for resource in (
        POOLS,
        GLOBAL_POOLS,
        PREFIX_POOLS,
        GLOBAL_PREFIX_POOLS,
        pool_resource(NETBOX_POOL),
        pool_resource(GLOBAL_NETBOX_POOL),
        pool_resource(INFOBLOX_POOL),
        INSTANCES,
        SECRETS,
        CLAIMS,
    )
}
# How each refuser's answer reads: the API server's own checks answer "<kind> "<name>" is invalid: <field>: ...".
REFUSED_BY = {
    "webhook": 'admission webhook "validation.',
    "strict field validation": "strict decoding error",
    "schema": " is invalid: ",
    "CEL": " is invalid: ",
}
SURFACED_WITHIN = 180.0  # generous: the machine is shared; a case passes as soon as it is seen


@dataclass(frozen=True)
class Case:
    """One entry of index.yaml: its file's documents (the last is the case) and what must become of it."""

    file: str
    what: str
    expect: str
    field: str
    message: str
    documents: list[Object]
    by: str = ""
    condition: dict[str, str] = dataclasses.field(default_factory=dict)
    event: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def target(self) -> Object:
        return self.documents[-1]


def documents(text: str, namespace: str) -> list[Object]:
    return [doc for doc in yaml.safe_load_all(text.replace("${NS}", namespace)) if doc]


def load_corpus(namespace: str) -> tuple[list[Object], list[Case]]:
    """The support objects and the cases, with ${NS} replaced by `namespace`."""
    index = yaml.safe_load((CORPUS / "index.yaml").read_text())
    support = documents((CORPUS / index["support"]).read_text(), namespace)
    cases = []
    for entry in index["cases"]:
        docs = documents((CORPUS / entry["file"]).read_text(), namespace)
        values = {k: str(v).replace("${NS}", namespace) for k, v in entry.items() if isinstance(v, str)}
        values.pop("go", None)
        cases.append(Case(**values, documents=docs, condition=entry.get("condition", {}), event=entry.get("event", {})))
    return support, cases


def test_the_corpus_is_large_and_each_file_is_one_case() -> None:
    """At least 60 cases over every kind served, each file listed once, each entry complete."""
    _, cases = load_corpus("ns")
    files = {path.name for path in CORPUS.glob("*.yaml")} - {"index.yaml", "support.yaml"}
    assert len(cases) >= 60
    assert sorted(case.file for case in cases) == sorted(files)
    kinds = {case.target["kind"] for case in cases}
    assert kinds >= {*RESOURCES} - {"Secret"}, {*RESOURCES} - kinds
    for case in cases:
        assert case.expect in ("refused", "condition"), case.file
        assert case.field and case.message, case.file
        if case.expect == "refused":
            assert case.by in REFUSED_BY, case.file
        else:
            assert set(case.condition) == {"type", "status", "reason"} and set(case.event) == {"reason", "message"}


async def apply(kube: KubeClient, doc: Object, namespace: str, label: str) -> Object:
    """Create `doc` as `kubectl apply` would (strict field validation), labelled for the test's webhook."""
    resource = RESOURCES[doc["kind"]]
    return await kube.create(
        resource, labelled(doc, label), namespace if resource.namespaced else None, field_validation="Strict"
    )


async def refusal_problem(kube: KubeClient, case: Case, namespace: str, label: str) -> str | None:
    """Apply a `refused` case: what is wrong with the outcome, or None."""
    for doc in case.documents[:-1]:
        await apply(kube, doc, namespace, label)
    try:
        await apply(kube, case.target, namespace, label)
    except ApiError as error:
        if error.status not in (400, 403, 422):
            return f"refused with status {error.status}: {error.message}"
        missing = [text for text in (case.field, case.message, REFUSED_BY[case.by]) if text not in error.message]
        return f"message lacks {missing}: {error.message}" if missing else None
    return "accepted"


def condition_of(obj: Object | None, kind: str) -> Object | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


async def surfaced_problem(kube: KubeClient, case: Case, namespace: str, events: list[Object]) -> str | None:
    """What is still missing of a `condition` case's condition and Event, or None once both are there."""
    target = case.target
    resource = RESOURCES[target["kind"]]
    obj = await kube.get(resource, target["metadata"]["name"], namespace if resource.namespaced else None)
    seen = condition_of(obj, case.condition["type"])
    if seen is None:
        return f"no {case.condition['type']} condition yet: {((obj or {}).get('status') or {}).get('conditions')}"
    wanted = (case.condition["status"], case.condition["reason"])
    text = str(seen.get("message") or "")
    if (seen.get("status"), seen.get("reason")) != wanted or case.field not in text or case.message not in text:
        return f"condition is {seen}"
    for event in events:
        involved = event.get("involvedObject") or {}
        if (involved.get("kind"), involved.get("name")) != (target["kind"], target["metadata"]["name"]):
            continue
        if event.get("reason") == case.event["reason"] and case.event["message"] in str(event.get("message")):
            return None
    return f"no Event {case.event}"


@dataclass
class Outcome:
    """The cases whose outcome is not the expected one, with what was seen."""

    wrong: dict[str, str] = dataclasses.field(default_factory=dict)

    def report(self) -> str:
        return "\n".join(f"{file}: {problem}" for file, problem in sorted(self.wrong.items()))


async def wait_surfaced(kube: KubeClient, cases: list[Case], namespace: str, outcome: Outcome) -> None:
    """Wait until every `condition` case shows its condition and Event, or the deadline; record those that don't."""
    pending = {case.file: case for case in cases}
    deadline = time.monotonic() + SURFACED_WITHIN
    while pending:
        items, _ = await kube.list(EVENTS, namespace)
        cluster_scoped, _ = await kube.list(EVENTS, "default")
        for name, case in list(pending.items()):
            problem = await surfaced_problem(kube, case, namespace, [*items, *cluster_scoped])
            if problem is None:
                del pending[name]
                outcome.wrong.pop(name, None)
            else:
                outcome.wrong[name] = problem
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(1.0)


def other_backends() -> list[Any]:
    """NetBox and Infoblox, with short timers so that problems show within seconds."""
    netbox = NetboxSettings(client=ClientSettings(attempts=1, connect_timeout=2.0, read_timeout=5.0), secret_seconds=1)
    infoblox = InfobloxSettings(
        instance_cache_seconds=0.5,
        unhealthy_recheck_seconds=1.0,
        not_ready_retry_seconds=1.0,
        retry=RetryPolicy(attempts=1, base_delay=0.05, max_delay=0.1),
    )

    def netbox_backend(context: BackendContext) -> NetboxBackend:
        return NetboxBackend(context, netbox)

    def infoblox_backend(context: BackendContext) -> InfobloxBackend:
        return InfobloxBackend(context, infoblox)

    return [netbox_backend, infoblox_backend]


async def delete_cluster_scoped(kube: KubeClient, cases: list[Case]) -> None:
    for case in cases:
        for doc in case.documents:
            resource = RESOURCES[doc["kind"]]
            if not resource.namespaced:
                await kube.delete(resource, doc["metadata"]["name"])


@pytest.mark.apiserver
async def test_every_bad_input_is_refused_or_surfaced(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    support, cases = load_corpus(namespace)
    outcome = Outcome()
    async with webhook(kube, kubeconfig, namespace, tmp_path, extra_backends=other_backends()) as label:
        try:
            await apply(kube, pool("corpus-good", ["10.88.0.0/24"], 24), namespace, label)
            # The namespace holds the InfobloxInstances' Secrets: lent to cluster-scoped objects.
            await kube.patch(NAMESPACES, namespace, {"metadata": {"labels": {SECRET_REFS_LABEL: "true"}}})
            for doc in support:
                await apply(kube, doc, namespace, label)
            for case in cases:
                if case.expect == "refused":
                    problem = await refusal_problem(kube, case, namespace, label)
                    if problem is not None:
                        outcome.wrong[case.file] = problem
                else:
                    for doc in case.documents:
                        await apply(kube, doc, namespace, label)
            surfaced = [case for case in cases if case.expect == "condition"]
            await wait_surfaced(kube, surfaced, namespace, outcome)
            # The controller still serves a good pool after all of it.
            await kube.create(CLAIMS, claim("corpus-good-claim", "corpus-good"), namespace)
            address = await wait_address(kube, namespace, "corpus-good-claim", timeout=120)
            assert address["spec"]["address"] == "10.88.0.1"
        finally:
            await delete_cluster_scoped(kube, cases)
    assert not outcome.wrong, f"{len(outcome.wrong)} of {len(cases)} cases went wrong:\n{outcome.report()}"
