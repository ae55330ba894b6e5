"""Install CRDs (Cluster API's and ours) with server-side apply and wait until each is Established and its
objects can be listed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ipam_provider.runtime.kube.client import KubeClient, apply_patch
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import CRDS, Resource

FIELD_MANAGER = "ipam-provider-dev"
# The labels `clusterctl init` gives Cluster API's own CRDs (kustomize adds them at release; the CRDs in the module's
# config/crd/bases lack them). `clusterctl move` discovers only the kinds whose CRD carries the first.
CLUSTERCTL_INIT_LABELS = {"clusterctl.cluster.x-k8s.io": "", "cluster.x-k8s.io/provider": "cluster-api"}


def load_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in paths:
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                documents.append(document)
    return documents


async def install_crds(
    kube: KubeClient,
    paths: Iterable[Path],
    timeout: float = 60.0,
    *,
    force: bool = True,
    only_missing: bool = False,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """Apply every CRD in `paths` and wait for `Established`; return their names.

    `force` takes over fields other managers own (right for a control plane of our own). `only_missing` leaves a
    CRD that exists alone (a cluster someone else runs: its Cluster API CRDs are its own business). Without
    `force`, a CRD whose fields another manager owns fails with a 409 Conflict instead of being overwritten.
    `labels` are added to every CRD's labels (e.g. CLUSTERCTL_INIT_LABELS, as `clusterctl init` would).
    """
    names, installed = [], []
    for crd in load_documents(paths):
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        name = crd["metadata"]["name"]
        if labels:
            crd["metadata"]["labels"] = {**(crd["metadata"].get("labels") or {}), **labels}
        if only_missing and await kube.get(CRDS, name) is not None:
            names.append(name)
            continue
        await kube.patch(CRDS, name, crd, form=apply_patch(FIELD_MANAGER, force=force))
        names.append(name)
        installed.append(crd)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            stored = await kube.get(CRDS, name)
            conditions = ((stored or {}).get("status") or {}).get("conditions") or []  # null right after creation
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f} s: {conditions}")
            await asyncio.sleep(0.1)
    for crd in installed:
        await _wait_listable(kube, crd, deadline)
    return names


async def _wait_listable(kube: KubeClient, crd: Mapping[str, Any], deadline: float) -> None:
    """Until a LIST of each served version answers: an Established CRD's storage may still be initializing (429
    "storage is (re)initializing"), and a version added by an update is routed a moment later (404)."""
    spec = crd["spec"]
    for version in (v["name"] for v in spec["versions"] if v.get("served", True)):
        names = spec["names"]
        resource = Resource(spec["group"], version, names["plural"], names["kind"], spec["scope"] == "Namespaced")
        while True:
            pages = kube.list_pages(resource, limit=1)
            try:
                await anext(pages)
                break
            except ApiError as error:
                if error.status not in (404, 429) or time.monotonic() > deadline:
                    raise
            finally:
                await pages.aclose()
            await asyncio.sleep(0.1)
