"""What a pool or an instance may read on its tenant's behalf: the one way a backend reads a Secret a spec names,
and the namespace checks behind it (docs/security.md).

- A namespaced object reads Secrets of its own namespace only.
- A cluster-scoped object (a Global pool, an InfobloxInstance) reads a Secret of the namespace it names, and only when
  that Namespace carries the label `SECRET_REFS_LABEL: "true"`: whoever may label a Namespace lends its Secrets.
- Every name is checked (a DNS subdomain, a namespace a DNS label) before any request is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS, label_problem, subdomain_problem

SECRET_REFS_LABEL = "ipam.cluster.x-k8s.io/allow-cluster-scoped-secret-refs"


class AccessDenied(Exception):
    """The object may not read what its spec names; the message says why and how to allow it, and names no
    content of what it named."""


@dataclass(frozen=True)
class Referrer:
    """The object whose spec names a Secret: its kind, name and namespace (None: cluster-scoped)."""

    kind: str
    name: str
    namespace: str | None

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"


def name_problem(field: str, name: str, namespace: str | None = None) -> str | None:
    """Why `field` (`name` in `namespace`) cannot name an object, or None."""
    if problem := subdomain_problem(name):
        return f"{field}.name: {problem}"
    if namespace is not None and (problem := label_problem(namespace)):
        return f"{field}.namespace: {problem}"
    return None


async def read_secret(kube: KubeClient, referrer: Referrer, field: str, name: str, namespace: str) -> Object | None:
    """The Secret `namespace/name` that `referrer`'s `field` names, or None if it does not exist. Raises
    AccessDenied, before any read of it, when a name is malformed or the namespace does not lend its Secrets to
    `referrer`."""
    if problem := name_problem(field, name, namespace):
        raise AccessDenied(problem)
    if referrer.namespace is not None and namespace != referrer.namespace:
        raise AccessDenied(
            f"{field} names a Secret in namespace {namespace!r}; {referrer} may read Secrets of its own namespace only"
        )
    if referrer.namespace is None:
        labels = await namespace_labels(kube, namespace)
        if labels is None or labels.get(SECRET_REFS_LABEL) != "true":
            raise AccessDenied(
                f"{field} names a Secret in namespace {namespace!r}, which does not lend its Secrets to cluster-scoped "
                f"objects; label the Namespace {SECRET_REFS_LABEL}=true to allow it"
            )
    return await kube.get(SECRETS, name, namespace)


async def namespace_labels(kube: KubeClient, namespace: str) -> Mapping[str, str] | None:
    """The labels of Namespace `namespace`, or None if it does not exist (or its name is malformed)."""
    if label_problem(namespace):
        return None
    found = await kube.get(NAMESPACES, namespace)
    return None if found is None else dict((found.get("metadata") or {}).get("labels") or {})


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether `labels` match a metav1.LabelSelector (matchLabels and matchExpressions; an empty selector matches
    everything). An expression with an unknown operator matches nothing."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        present = key in labels
        matched = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(operator), False)
        if not matched:
            return False
    return True
