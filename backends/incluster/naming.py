"""The names and labels of `InClusterIPReservation`s: a reservation's *name* encodes (pool, address), or (domain,
address) for a pool of a uniqueness domain (see `domains`), so the API server's create-uniqueness decides who holds
an address. Each carries its pool's label, a domain's also the domain's.
"""

from __future__ import annotations

import hashlib
import ipaddress

from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.backend.contract import PoolRef
from ipam_provider.runtime.kube.resources import Resource

RESERVATIONS = Resource(IPAM_GROUP, "v1alpha2", "inclusteripreservations", "InClusterIPReservation", False)
LABEL_POOL = "ipam.cluster.x-k8s.io/pool-hash"
LABEL_CLAIM_UID = "ipam.cluster.x-k8s.io/claim-uid"
LABEL_DOMAIN = "ipam.cluster.x-k8s.io/uniqueness-domain"
# On a release record: its pool's reuse grace period when it was released, for the other pools of its domain.
ANNOTATION_GRACE = "ipam.cluster.x-k8s.io/reuse-grace-period-seconds"


def pool_hash(ref: PoolRef) -> str:
    identity = f"{ref.group}/{ref.kind}/{ref.namespace or ''}/{ref.name}"
    return hashlib.sha256(identity.encode()).hexdigest()[:20]


def domain_hash(domain: str) -> str:
    return hashlib.sha256(f"uniqueness-domain/{domain}".encode()).hexdigest()[:20]


def reservation_name(ref: PoolRef, address: str, domain: str | None = None) -> str:
    """The name of the reservation of `address` for the pool `ref`, or for every pool of `domain` when given."""
    ip = ipaddress.ip_address(address)
    encoded = str(ip) if ip.version == 4 else ip.exploded.replace(":", "-")
    return f"{domain_hash(domain) if domain else pool_hash(ref)}.{encoded}"
