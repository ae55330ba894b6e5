"""Admission compared with the Go in-cluster provider v1.1.0, case by case, on the real API server.

The table restates, in our own words, every test case of the Go provider v1.1.0's pool webhooks (address pools and
prefix pools: valid specs, invalid specs, updates that strand addresses in use, deletes of pools in use) and cases
that follow from its parsers rather than from its tests (blanks around an entry, zones, reversed exclusions, ...).
Each row names the pool kinds it runs for, the spec (or old spec -> new spec, or the delete), the Go provider's
verdict as installed (its CRD schema, then its webhooks) with the field it names, and ours, with who refuses here:
`schema` (the CRD's OpenAPI), `CEL` (the CRD's rules) or `webhook` (this provider's admission webhook). Where Go
names no field (stranding, deleting in use: its answers are plain BadRequests), `field` is the subject of its text.

What Go refuses we refuse, naming the field; what Go accepts we accept. Each row where the verdicts differ, or name
another field, says why (`why`): those are the deliberate differences, tested as such.

Every row runs with our CRDs and our webhook registered (tests/ipam_provider/test_admission.py's `webhook`), the
controller serving one namespace for the whole module. Go's address-pool tests check each spec on CREATE and on
UPDATE, so the address-pool rows that create a pool also replace a valid pool's spec with theirs.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import JSON_PATCH, KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import NAMESPACES, Resource
from tests.ipam_provider.test_admission import SKIP_DELETE_VALIDATION, labelled, webhook
from tests.support.cluster import wait_for
from tests.support.objects import GLOBAL_POOLS, GLOBAL_PREFIX_POOLS, POOLS, PREFIX_POOLS, claim, wait_address

IP = ("InClusterIPPool", "GlobalInClusterIPPool")
PREFIX = ("InClusterPrefixPool", "GlobalInClusterPrefixPool")
RESOURCES: dict[str, Resource] = {
    "InClusterIPPool": POOLS,
    "GlobalInClusterIPPool": GLOBAL_POOLS,
    "InClusterPrefixPool": PREFIX_POOLS,
    "GlobalInClusterPrefixPool": GLOBAL_PREFIX_POOLS,
}
SHORT = {"InClusterIPPool": "ip", "GlobalInClusterIPPool": "gip", "InClusterPrefixPool": "pp"}
SHORT["GlobalInClusterPrefixPool"] = "gpp"
# How each refuser's answer reads on the wire.
REFUSED_BY = {"schema": " is invalid: ", "CEL": " is invalid: ", "webhook": 'admission webhook "validation.'}
# The valid pool an address-pool row's UPDATE starts from (Go checks every spec on UPDATE too).
BASE_IP_SPEC: Object = {"addresses": ["192.0.2.0/24"], "prefix": 24}
STRICTER = "Kubernetes' CEL isIP/isCIDR, which our CRD uses, refuse zones and IPv4-mapped IPv6 addresses"
GO_WARNS = "Go's webhook answers with warnings (allocationPrefixLength 128)"


@dataclass(frozen=True)
class Verdict:
    """Accepted, or refused naming `field`, with a text the answer carries (`says`)."""

    accepted: bool
    field: str = ""
    says: str = ""


ACCEPTED = Verdict(True)


def refused(field_path: str, says: str) -> Verdict:
    return Verdict(False, field_path, says)


@dataclass(frozen=True)
class Case:
    """One row. `op` is what is checked: `create` (the spec), `update` (`old` -> `spec`, after claims got `held`),
    `delete` (a pool of `spec` whose claims got `held`; released first when `release`, annotated `annotations`).
    `origin`: `test` (a case of the Go provider's webhook tests), `parser` (follows from its parsers, not in its
    tests), `ours` (a deliberate difference this provider adds). `go_cases` counts the Go test cases it restates."""

    name: str
    kinds: tuple[str, ...]
    spec: Object
    go: Verdict
    ours: Verdict
    by: str = ""
    op: str = "create"
    old: Object | None = None
    held: tuple[str, ...] = ()
    release: bool = False
    annotations: dict[str, str] = field(default_factory=dict)
    origin: str = "test"
    go_cases: int = 1
    why: str = ""


def same(case_name: str, kinds: tuple[str, ...], spec: Object, verdict: Verdict, by: str = "", **rest: Any) -> Case:
    """A row where we answer as Go does: the same verdict, naming the same field (`verdict.says` is our text)."""
    go = verdict if verdict.accepted else refused(verdict.field, rest.pop("go_says", verdict.says))
    return Case(case_name, kinds, spec, go, verdict, by, **rest)


V4 = ["10.0.0.25", "10.0.0.26", "10.0.0.27"]
V6 = ["fe01::2", "fe01::3-fe01::5", "fe01::1:1/126"]
SUBNET = "provided address belongs to a different subnet than others"
NOT_ADDRESS = "provided address is not a valid IP, range, nor CIDR"
GW_FAMILY = "provided gateway and addresses are of mixed IP families"
# Go names the addresses a change strands; we count them (their holders may be another tenant's: docs/admission.md).
GO_STRANDED = "pool addresses do not contain allocated addresses: [10.0.0.10-10.0.0.10]"
STRANDED = "pool addresses do not contain allocated addresses: the new spec leaves out 1 address(es) in use"
LEAVES_OUT_ONE = "the new spec leaves out 1 address(es) in use"
IN_USE = "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed."
NON_ALLOCATABLE = "existing allocations become non-allocatable"
RANGE = ["10.0.0.10-10.0.0.20"]


def subnet_case(case_name: str, second: str, index: int = 1) -> Case:
    """Go's family of 'an entry outside the first entry's subnet' cases: 10.0.1.0 first, then `second`."""
    spec = {"addresses": ["10.0.1.0", second], "prefix": 24, "gateway": "10.0.0.1"}
    return same(case_name, IP, spec, refused(f"spec.addresses[{index}]", f"{SUBNET}: {second}"), "webhook")


CASES: list[Case] = [
    # --- address pools: the specs Go accepts (each on CREATE and UPDATE, for both kinds) ---
    same("ipv4-list-gateway", IP, {"addresses": V4, "gateway": "10.0.0.24", "prefix": 28}, ACCEPTED),
    same("ipv4-list-no-gateway", IP, {"addresses": V4, "prefix": 28}, ACCEPTED),
    same(
        "ipv4-list-exclusions",
        IP,
        {"addresses": V4, "prefix": 28, "excludedAddresses": ["10.0.0.23", "10.0.0.24"]},
        ACCEPTED,
    ),
    same("ipv6-mixed-entries-gateway", IP, {"addresses": V6, "gateway": "fe01::1", "prefix": 28}, ACCEPTED),
    same("ipv6-mixed-entries-no-gateway", IP, {"addresses": V6, "prefix": 28}, ACCEPTED),
    same(
        "ipv6-exclusions",
        IP,
        {"addresses": V6, "prefix": 28, "excludedAddresses": ["fe01::4", "fe01::6-fe01::8", "fe01::1:10/126"]},
        ACCEPTED,
    ),
    same(
        "grace-period-60",
        IP,
        {"addresses": V4[:2], "gateway": "10.0.0.24", "prefix": 28, "addressReuseGracePeriodSeconds": 60},
        ACCEPTED,
    ),
    same("prefix-zero", IP, {"addresses": RANGE, "prefix": 0, "gateway": "10.0.0.1"}, ACCEPTED, go_cases=2),
    same(
        "prefix-left-out",
        IP,
        {"addresses": RANGE, "gateway": "10.0.0.1"},
        refused("spec.prefix", "Required value"),
        "schema",
        why="Go's webhook test passes it (a Go struct cannot tell a missing prefix from 0, and Go clients always "
        "send it), but Go's CRD requires spec.prefix as ours does: on the wire both refuse it",
    ),
    # --- address pools: the specs Go refuses (each on CREATE and UPDATE, for both kinds) ---
    same(
        "addresses-empty",
        IP,
        {"addresses": [], "prefix": 24, "gateway": "10.0.0.1"},
        refused("spec.addresses", "addresses is required"),
        "CEL",
    ),
    same(
        "gateway-not-an-ip",
        IP,
        {"addresses": V4, "prefix": 24, "gateway": "invalid"},
        refused("spec.gateway", "provided gateway is not a valid IP address"),
        "CEL",
        go_says='ParseAddr("invalid"): unable to parse IP',
    ),
    same(
        "entry-in-another-subnet",
        IP,
        {"addresses": ["10.0.0.25", "10.0.0.26", "10.0.1.27"], "prefix": 24, "gateway": "10.0.0.1"},
        refused("spec.addresses[2]", f"{SUBNET}: 10.0.1.27"),
        "webhook",
    ),
    same(
        "entry-garbage",
        IP,
        {"addresses": ["10.0.0.25", "10.0.0.26", "garbage"], "prefix": 24, "gateway": "10.0.0.1"},
        refused("spec.addresses[2]", NOT_ADDRESS),
        "CEL",
    ),
    same(
        "prefix-negative",
        IP,
        {"addresses": V4[:2], "prefix": -1, "gateway": "10.0.0.1"},
        refused("spec.prefix", "should be greater than or equal to 0"),
        "schema",
        go_says="should be greater than or equal to 0 (its CRD; its webhook: a valid prefix is required)",
    ),
    same(
        "prefix-9999",
        IP,
        {"addresses": V4[:2], "prefix": 9999, "gateway": "10.0.0.1"},
        refused("spec.prefix", "should be less than or equal to 128"),
        "schema",
        go_says="should be less than or equal to 128 (its CRD; its webhook: provided prefix is not valid)",
    ),
    same(
        "range-reversed",
        IP,
        {"addresses": ["10.0.0.10-10.0.0.5"], "prefix": 24, "gateway": "10.0.0.1"},
        refused("spec.addresses[0]", "10.0.0.10-10.0.0.5"),
        "webhook",
        go_says=NOT_ADDRESS,
    ),
    same(
        "cidr-over-32",
        IP,
        {"addresses": ["10.0.0.10/33"], "prefix": 24, "gateway": "10.0.0.1"},
        refused("spec.addresses[0]", NOT_ADDRESS),
        "CEL",
    ),
    subnet_case("range-below-subnet", "10.0.0.10-10.0.0.20"),
    subnet_case("range-above-subnet", "10.0.2.10-10.0.2.20"),
    subnet_case("range-starts-below-subnet", "10.0.0.20-10.0.1.20"),
    subnet_case("range-ends-above-subnet", "10.0.1.20-10.0.2.20"),
    subnet_case("cidr-below-subnet", "10.0.0.1/24"),
    subnet_case("cidr-above-subnet", "10.0.2.1/24"),
    subnet_case("cidr-starts-below-subnet", "10.0.0.0/23"),
    subnet_case("cidr-ends-above-subnet", "10.0.1.0/23"),
    same(
        "ipv4-addresses-ipv6-gateway",
        IP,
        {"addresses": ["10.0.1.0", "10.0.0.2-10.0.0.250"], "prefix": 24, "gateway": "fd00::1"},
        refused("spec.gateway", GW_FAMILY),
        "CEL",
    ),
    same(
        "ipv6-addresses-ipv4-gateway",
        IP,
        {"addresses": ["fd00::1", "fd00::100-fd00::200"], "prefix": 24, "gateway": "10.0.0.1"},
        refused("spec.gateway", GW_FAMILY),
        "CEL",
    ),
    same(
        "addresses-of-both-families",
        IP,
        {
            "addresses": ["fd00::1", "fd00::100-fd00::200", "10.0.1.0", "10.0.0.2-10.0.0.250"],
            "prefix": 24,
            "gateway": "10.0.0.1",
        },
        refused("spec.addresses", "provided addresses are of mixed IP families"),
        "CEL",
    ),
    same(
        "exclusions-of-both-families",
        IP,
        {
            "addresses": ["10.0.1.0", "10.0.0.2-10.0.0.250"],
            "prefix": 24,
            "gateway": "10.0.0.1",
            "excludedAddresses": ["fd00::1", "10.0.0.4"],
        },
        refused("spec.excludedAddresses", "addresses and excluded addresses are of mixed IP families"),
        "CEL",
        go_says="provided addresses are of mixed IP families",
    ),
    same(
        "exclusions-of-the-other-family",
        IP,
        {
            "addresses": ["10.0.1.0", "10.0.0.2-10.0.0.250"],
            "prefix": 24,
            "gateway": "10.0.0.1",
            "excludedAddresses": ["fd00::1"],
        },
        refused("spec.excludedAddresses", "addresses and excluded addresses are of mixed IP families"),
        "CEL",
    ),
    same(
        "grace-period-negative",
        IP,
        {"addresses": RANGE, "prefix": 24, "gateway": "10.0.0.1", "addressReuseGracePeriodSeconds": -1},
        refused("spec.addressReuseGracePeriodSeconds", "should be greater than or equal to 0"),
        "schema",
        go_says="should be greater than or equal to 0 (its CRD; its webhook: must not be negative)",
    ),
    # --- address pools: what Go's parsers refuse, though no Go test case says so ---
    same(
        "address-with-leading-blank",
        IP,
        {"addresses": [" 10.0.0.1"], "prefix": 24},
        refused("spec.addresses[0]", NOT_ADDRESS),
        "CEL",
        origin="parser",
    ),
    same(
        "exclusion-with-trailing-blank",
        IP,
        {"addresses": ["10.0.0.0/24"], "prefix": 24, "excludedAddresses": ["10.0.0.5 "]},
        refused("spec.excludedAddresses[0]", NOT_ADDRESS),
        "CEL",
        origin="parser",
    ),
    same(
        "gateway-with-leading-blank",
        IP,
        {"addresses": ["10.0.0.0/24"], "prefix": 24, "gateway": " 10.0.0.1"},
        refused("spec.gateway", "provided gateway is not a valid IP address"),
        "CEL",
        origin="parser",
        go_says='ParseAddr(" 10.0.0.1"): unexpected character',
    ),
    same(
        "range-of-two-families",
        IP,
        {"addresses": ["10.0.0.1-fd00::1"], "prefix": 24},
        refused("spec.addresses[0]", "10.0.0.1-fd00::1"),
        "webhook",
        origin="parser",
        go_says=NOT_ADDRESS,
    ),
    same(
        "cidr-with-a-netmask",
        IP,
        {"addresses": ["10.0.0.0/255.255.255.0"], "prefix": 24},
        refused("spec.addresses[0]", NOT_ADDRESS),
        "CEL",
        origin="parser",
    ),
    same(
        "address-with-leading-zero",
        IP,
        {"addresses": ["010.0.0.1"], "prefix": 24},
        refused("spec.addresses[0]", NOT_ADDRESS),
        "CEL",
        origin="parser",
    ),
    same(
        "range-of-three-addresses",
        IP,
        {"addresses": ["10.0.0.1-10.0.0.2-10.0.0.3"], "prefix": 24},
        refused("spec.addresses[0]", NOT_ADDRESS),
        "CEL",
        origin="parser",
    ),
    same(
        "range-with-blanks-around-the-dash",
        IP,
        {"addresses": ["10.0.0.1 - 10.0.0.5"], "prefix": 24},
        refused("spec.addresses[0]", NOT_ADDRESS),
        "CEL",
        origin="parser",
    ),
    same(
        "exclusion-range-reversed",
        IP,
        {"addresses": ["10.0.0.0/24"], "prefix": 24, "excludedAddresses": ["10.0.0.9-10.0.0.1"]},
        refused("spec.excludedAddresses[0]", "10.0.0.9-10.0.0.1"),
        "webhook",
        origin="parser",
        go_says=NOT_ADDRESS,
    ),
    # --- address pools: what Go accepts though it is likely a mistake (we accept it and flag SpecConsistent) ---
    same("single-address-range", IP, {"addresses": ["10.0.0.1-10.0.0.1"], "prefix": 24}, ACCEPTED, origin="parser"),
    same(
        "exclusion-outside-the-addresses",
        IP,
        {"addresses": ["10.0.0.0/24"], "prefix": 24, "excludedAddresses": ["192.168.0.1"]},
        ACCEPTED,
        origin="parser",
    ),
    same(
        "gateway-outside-the-subnet",
        IP,
        {"addresses": ["10.0.0.0/24"], "prefix": 24, "gateway": "10.0.1.1"},
        ACCEPTED,
        origin="parser",
    ),
    same(
        "overlapping-entries", IP, {"addresses": ["10.0.0.0/24", "10.0.0.5"], "prefix": 24}, ACCEPTED, origin="parser"
    ),
    # --- address pools: what Go's parsers accept and our CRD refuses (stricter; see the reasons) ---
    Case(
        "ipv4-mapped-ipv6-address",
        IP,
        {"addresses": ["::ffff:10.0.0.1"], "prefix": 120},
        go=ACCEPTED,
        ours=refused("spec.addresses[0]", NOT_ADDRESS),
        by="CEL",
        origin="parser",
        why=f"{STRICTER}; an IPv4-mapped IPv6 address would be handed out as IPv6 while it names an IPv4 host",
    ),
    Case(
        "address-with-a-zone",
        IP,
        {"addresses": ["fe80::1%eth0"], "prefix": 64},
        go=ACCEPTED,
        ours=refused("spec.addresses[0]", NOT_ADDRESS),
        by="CEL",
        origin="parser",
        why=f"{STRICTER}; a zone names an interface of one host and means nothing in an IPAddress",
    ),
    Case(
        "gateway-with-a-zone",
        IP,
        {"addresses": ["fe80::/64"], "prefix": 64, "gateway": "fe80::1%eth0"},
        go=ACCEPTED,
        ours=refused("spec.gateway", "provided gateway is not a valid IP address"),
        by="CEL",
        origin="parser",
        why=f"{STRICTER}; a zone names an interface of one host and means nothing in an IPAddress",
    ),
    # --- address pools: updates and deletes with addresses in use (for both kinds) ---
    same(
        "update-strands-an-address-in-use",
        IP,
        {"addresses": ["10.0.0.15-10.0.0.20"], "prefix": 24, "gateway": "10.0.0.1"},
        refused("pool addresses", STRANDED),
        "webhook",
        go_says=GO_STRANDED,
        op="update",
        old={"addresses": RANGE, "prefix": 24, "gateway": "10.0.0.1"},
        held=("10.0.0.10",),
    ),
    same(
        "delete-in-use",
        IP,
        {"addresses": RANGE, "prefix": 24, "gateway": "10.0.0.1"},
        refused("Pool", IN_USE),
        "webhook",
        op="delete",
        held=("10.0.0.10",),
    ),
    same(
        "delete-once-released",
        IP,
        {"addresses": RANGE, "prefix": 24, "gateway": "10.0.0.1"},
        ACCEPTED,
        op="delete",
        held=("10.0.0.10",),
        release=True,
    ),
    same(
        "delete-in-use-with-skip-annotation",
        IP,
        {"addresses": RANGE, "prefix": 24, "gateway": "10.0.0.1"},
        ACCEPTED,
        op="delete",
        held=("10.0.0.10",),
        annotations={SKIP_DELETE_VALIDATION: ""},
    ),
    # --- prefix pools: the specs Go's table refuses (Go runs it for InClusterPrefixPool; its webhook serves both) ---
    same(
        "prefixes-left-out",
        PREFIX,
        {},
        refused("spec.prefixes", "Required value"),
        "schema",
        go_says="Required value (its CRD; its webhook: prefixes is required)",
    ),
    same(
        "prefixes-empty",
        PREFIX,
        {"prefixes": []},
        refused("spec.prefixes", "prefixes is required"),
        "CEL",
        origin="parser",
    ),
    same(
        "prefix-is-an-address",
        PREFIX,
        {"prefixes": ["fd00::1"]},
        refused("spec.prefixes[0]", "provided entry is not a valid IPv6 CIDR"),
        "CEL",
    ),
    same(
        "prefix-not-network-aligned",
        PREFIX,
        {"prefixes": ["fd00::1/64"]},
        refused("spec.prefixes[0]", "CIDR must be network-aligned"),
        "CEL",
    ),
    same(
        "prefix-longer-than-children",
        PREFIX,
        {"prefixes": ["fd00::/65"]},
        refused("spec.prefixes", "CIDR prefix length must be <= allocationPrefixLength"),
        "CEL",
    ),
    Case(
        "ipv4-prefix-with-default-length",
        PREFIX,
        {"prefixes": ["10.0.0.0/24"]},
        go=refused("spec.prefixes", "only IPv6 prefixes are supported"),
        ours=refused("spec.allocationPrefixLength", "allocationPrefixLength must be between 1 and 32 for IPv4"),
        by="CEL",
        why="IPv4 prefix pools are ours (see ipv4-prefix-pool); this one is refused for its allocationPrefixLength, "
        "64 by default, which no IPv4 child can have",
    ),
    same(
        "gateway-ipv4-in-ipv6-pool",
        PREFIX,
        {"prefixes": ["fd00::/64"], "gateway": "10.0.0.1"},
        refused("spec.gateway", "provided gateway must be IPv6"),
        "CEL",
    ),
    same(
        "exclusion-ipv4-in-ipv6-pool",
        PREFIX,
        {"prefixes": ["fd00::/64"], "excludedPrefixes": ["10.0.0.1"]},
        refused("spec.excludedPrefixes", "only IPv6 excluded prefixes are supported"),
        "CEL",
    ),
    same(
        "prefix-with-leading-blank",
        PREFIX,
        {"prefixes": [" fd00::/48"]},
        refused("spec.prefixes[0]", "provided entry is not a valid IPv6 CIDR"),
        "CEL",
        origin="parser",
    ),
    same(
        "exclusion-range-reversed-in-prefix-pool",
        PREFIX,
        {"prefixes": ["fd00::/48"], "excludedPrefixes": ["fd00::9-fd00::1"]},
        refused("spec.excludedPrefixes[0]", "fd00::9-fd00::1"),
        "webhook",
        origin="parser",
        go_says="provided entry is not a valid IP, range, nor CIDR",
    ),
    same(
        "exclusion-range-of-two-families",
        PREFIX,
        {"prefixes": ["fd00::/48"], "excludedPrefixes": ["fd00::1-10.0.0.1"]},
        refused("spec.excludedPrefixes[0]", "fd00::1-10.0.0.1"),
        "webhook",
        origin="parser",
        go_says="provided entry is not a valid IP, range, nor CIDR",
    ),
    same(
        "exclusion-garbage",
        PREFIX,
        {"prefixes": ["fd00::/48"], "excludedPrefixes": ["garbage"]},
        refused("spec.excludedPrefixes[0]", "provided entry is not a valid IP, range, nor CIDR"),
        "CEL",
        origin="parser",
    ),
    same(
        "prefix-pool-gateway-not-an-ip",
        PREFIX,
        {"prefixes": ["fd00::/48"], "gateway": "nope"},
        refused("spec.gateway", "provided gateway is not a valid IP address"),
        "CEL",
        origin="parser",
        go_says='ParseAddr("nope"): unable to parse IP',
    ),
    Case(
        "prefixes-of-both-families",
        PREFIX,
        {"prefixes": ["fd00::/48", "10.0.0.0/16"], "allocationPrefixLength": 24},
        go=refused("spec.prefixes", "only IPv6 prefixes are supported"),
        ours=refused("spec.prefixes", "provided prefixes are of mixed IP families"),
        by="CEL",
        origin="parser",
    ),
    same(
        "children-of-129",
        PREFIX,
        {"prefixes": ["fd00::/48"], "allocationPrefixLength": 129},
        refused("spec.allocationPrefixLength", "should be less than or equal to 128"),
        "schema",
        origin="parser",
    ),
    same(
        "prefix-with-a-zone",
        PREFIX,
        {"prefixes": ["fe80::%eth0/64"]},
        refused("spec.prefixes[0]", "provided entry is not a valid IPv6 CIDR"),
        "CEL",
        origin="parser",
    ),
    same("overlapping-prefixes", PREFIX, {"prefixes": ["fd00::/48", "fd00::/56"]}, ACCEPTED, origin="parser"),
    same(
        "exclusion-outside-the-prefixes",
        PREFIX,
        {"prefixes": ["fd00::/48"], "excludedPrefixes": ["fd01::/64"]},
        ACCEPTED,
        origin="parser",
    ),
    # --- prefix pools: the specs Go accepts ---
    same("disjoint-prefixes", PREFIX, {"prefixes": ["fd00::/64", "fd01::/64"]}, ACCEPTED),
    same("children-of-56", PREFIX, {"prefixes": ["fd00::/48"], "allocationPrefixLength": 56}, ACCEPTED),
    same("children-of-96", PREFIX, {"prefixes": ["fd00::/48"], "allocationPrefixLength": 96}, ACCEPTED),
    same(
        "children-of-128",
        PREFIX,
        {"prefixes": ["fd00::/48"], "allocationPrefixLength": 128},
        ACCEPTED,
        why=f"{GO_WARNS}; we accept it silently (docs/admission.md, differences)",
    ),
    same("children-of-64", PREFIX, {"prefixes": ["fd00::/48"], "allocationPrefixLength": 64}, ACCEPTED),
    same(
        "children-of-128-gateway-inside",
        PREFIX,
        {"prefixes": ["fd40::/64"], "allocationPrefixLength": 128, "gateway": "fd40::1"},
        ACCEPTED,
        why=f"{GO_WARNS} and a gateway inside the prefixes; we accept it silently",
    ),
    same(
        "children-of-128-no-gateway",
        PREFIX,
        {"prefixes": ["fd60::/64"], "allocationPrefixLength": 128},
        ACCEPTED,
        why=f"{GO_WARNS}; we accept it silently",
    ),
    same("gateway-outside-prefixes", PREFIX, {"prefixes": ["fd50::/64"], "gateway": "fd51::1"}, ACCEPTED),
    # --- prefix pools: updates and deletes (Go tests both kinds for stranding, the namespaced kind otherwise) ---
    same(
        "update-narrows-past-a-child-in-use",
        PREFIX,
        {"prefixes": ["fd00:0:0:1::/64"]},
        refused("existing allocations", f"{NON_ALLOCATABLE}: {LEAVES_OUT_ONE}"),
        "webhook",
        go_says=f"{NON_ALLOCATABLE}: [fd00::]",
        op="update",
        old={"prefixes": ["fd00::/62"]},
        held=("fd00::",),
        go_cases=2,
    ),
    same(
        "update-excludes-a-child-in-use",
        PREFIX,
        {"prefixes": ["fd30::/62"], "excludedPrefixes": ["fd30::/64"]},
        refused("existing allocations", f"{NON_ALLOCATABLE}: {LEAVES_OUT_ONE}"),
        "webhook",
        go_says=f"{NON_ALLOCATABLE}: [fd30::]",
        op="update",
        old={"prefixes": ["fd30::/62"]},
        held=("fd30::",),
    ),
    same(
        "update-excludes-a-free-child-sets-gateway",
        PREFIX,
        {"prefixes": ["fd20::/62"], "excludedPrefixes": ["fd20:0:0:2::/64"], "gateway": "fd20:0:0:1::1"},
        ACCEPTED,
        op="update",
        old={"prefixes": ["fd20::/62"]},
        held=("fd20::",),
    ),
    same(
        "update-changes-child-length",
        PREFIX,
        {"prefixes": ["fd00::/48"], "allocationPrefixLength": 64},
        refused("spec.allocationPrefixLength", "spec.allocationPrefixLength is immutable"),
        "CEL",
        op="update",
        old={"prefixes": ["fd00::/48"], "allocationPrefixLength": 56},
    ),
    same(
        "update-128-adds-gateway-inside",
        PREFIX,
        {"prefixes": ["fd40::/64"], "allocationPrefixLength": 128, "gateway": "fd40::1"},
        ACCEPTED,
        op="update",
        old={"prefixes": ["fd40::/64"], "allocationPrefixLength": 128},
        why=f"{GO_WARNS} and a gateway inside the prefixes; we accept it silently",
    ),
    same(
        "update-adds-gateway-outside",
        PREFIX,
        {"prefixes": ["fd50::/64"], "gateway": "fd51::1"},
        ACCEPTED,
        op="update",
        old={"prefixes": ["fd50::/64"]},
    ),
    same(
        "prefix-delete-in-use",
        PREFIX,
        {"prefixes": ["fd00::/64"]},
        refused("Pool", IN_USE),
        "webhook",
        op="delete",
        held=("fd00::",),
    ),
    same(
        "prefix-delete-once-released",
        PREFIX,
        {"prefixes": ["fd00::/64"]},
        ACCEPTED,
        op="delete",
        held=("fd00::",),
        release=True,
    ),
    same(
        "prefix-delete-in-use-with-skip-annotation",
        PREFIX,
        {"prefixes": ["fd00::/64"]},
        ACCEPTED,
        op="delete",
        held=("fd00::",),
        annotations={SKIP_DELETE_VALIDATION: ""},
    ),
    # --- prefix pools: deliberate differences (Go refuses, we accept) ---
    Case(
        "ipv4-prefix-pool",
        PREFIX,
        {"prefixes": ["10.0.0.0/16"], "allocationPrefixLength": 24},
        go=refused("spec.prefixes", "only IPv6 prefixes are supported"),
        ours=ACCEPTED,
        origin="ours",
        go_cases=0,
        why="IPv4 prefix pools are this provider's addition: a /16 handing out /24s is as useful as a /48 handing "
        "out /64s (README: pool kinds)",
    ),
    Case(
        "ipv4-prefix-pool-gateway-exclusions",
        PREFIX,
        {
            "prefixes": ["10.0.0.0/16"],
            "allocationPrefixLength": 24,
            "gateway": "10.0.0.1",
            "excludedPrefixes": ["10.0.0.0/24"],
        },
        go=refused("spec.prefixes", "only IPv6 prefixes are supported (and spec.gateway, spec.excludedPrefixes)"),
        ours=ACCEPTED,
        origin="ours",
        go_cases=0,
        why="in an IPv4 prefix pool the gateway and exclusions are IPv4 (the IPv6 rules apply to IPv6 pools only)",
    ),
    # --- prefix pools: what Go accepts and we refuse (stricter; see the reasons) ---
    Case(
        "ipv4-mapped-prefix",
        PREFIX,
        {"prefixes": ["::ffff:10.0.0.0/104"], "allocationPrefixLength": 120},
        go=ACCEPTED,
        ours=refused("spec.prefixes[0]", "provided entry is not a valid IPv6 CIDR"),
        by="CEL",
        origin="parser",
        why=f"{STRICTER}; its children would be IPv4 hosts written as IPv6 (an IPv4 prefix pool serves them)",
    ),
    Case(
        "prefix-pool-gateway-with-a-zone",
        PREFIX,
        {"prefixes": ["fd00::/48"], "gateway": "fe80::1%eth0"},
        go=ACCEPTED,
        ours=refused("spec.gateway", "provided gateway is not a valid IP address"),
        by="CEL",
        origin="parser",
        why=f"{STRICTER}; a zone names an interface of one host and means nothing in an IPAddress",
    ),
    Case(
        "children-of-0",
        PREFIX,
        {"prefixes": ["fd00::/48"], "allocationPrefixLength": 0},
        go=ACCEPTED,
        ours=refused("spec.allocationPrefixLength", "should be greater than or equal to 1"),
        by="schema",
        origin="parser",
        why="Go's defaulting webhook turns 0 into 64 before its CRD's minimum of 1 is checked; we have no "
        "defaulting webhook, so the CRD's minimum refuses it (leave the field out to get 64)",
    ),
]


def runs() -> list[Any]:
    return [pytest.param(case, kind, id=f"{case.name}[{SHORT[kind]}]") for case in CASES for kind in case.kinds]


def test_the_table_is_complete() -> None:
    """Every difference carries its reason; names are unique; the counts the docs quote."""
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    for case in CASES:
        differs = case.go.accepted != case.ours.accepted or case.go.field != case.ours.field
        assert case.why or not differs, f"{case.name}: Go and we differ without a reason"
        assert case.ours.accepted == (case.by == ""), case.name
        assert case.op in ("create", "update", "delete") and (case.old is not None) == (case.op == "update")
    go_cases = sum(case.go_cases for case in CASES if case.origin == "test")
    assert go_cases == 61, go_cases


@dataclass
class Stage:
    """The module's webhook: its namespace and the label its objects carry."""

    namespace: str
    label: str


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stage(kube: KubeClient, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stage]:
    """One controller, its webhook registered, for every row: a namespace of its own (made as `namespace` makes
    it), removed afterwards."""
    namespace = f"t-{secrets.token_hex(4)}"
    await kube.create(NAMESPACES, {"metadata": {"name": namespace, "labels": {"ipam-provider-test": "true"}}})
    try:
        async with webhook(kube, kubeconfig, namespace, tmp_path_factory.mktemp("go-compat")) as label:
            yield Stage(namespace, label)
    finally:
        await kube.delete(NAMESPACES, namespace)


class Pools:
    """The pools and claims of one row, named after it; `cleanup` releases the claims, then deletes the pools."""

    def __init__(self, kube: KubeClient, stage: Stage, kind: str, stem: str) -> None:
        self.kube, self.stage, self.kind, self.stem = kube, stage, kind, stem
        self.resource = RESOURCES[kind]
        self.names: list[str] = []
        self.claims: list[str] = []

    @property
    def namespace(self) -> str | None:
        return self.stage.namespace if self.resource.namespaced else None

    def body(self, name: str, spec: Object, annotations: dict[str, str] | None = None) -> Object:
        metadata: Object = {"name": name, "annotations": dict(annotations or {})}
        obj = {"apiVersion": self.resource.api_version, "kind": self.kind, "metadata": metadata, "spec": spec}
        return labelled(obj, self.stage.label)

    def name(self, suffix: str) -> str:
        global_prefix = "" if self.resource.namespaced else f"{self.stage.namespace}-"
        return f"{global_prefix}{self.stem}-{suffix}"

    async def create(self, suffix: str, spec: Object, annotations: dict[str, str] | None = None) -> str:
        name = self.name(suffix)
        body = self.body(name, spec, annotations)
        await self.kube.create(self.resource, body, self.namespace, field_validation="Strict")
        self.names.append(name)
        return name

    async def respec(self, name: str, spec: Object) -> None:
        """Replace the pool's whole spec (a JSON patch: no read-modify-write race with the controller's writes)."""
        change = [{"op": "replace", "path": "/spec", "value": spec}]
        await self.kube.patch(self.resource, name, change, self.namespace, form=JSON_PATCH)

    async def hold(self, name: str, count: int) -> list[str]:
        """`count` claims fulfilled from the pool, one after another: their addresses."""
        got = []
        for index in range(count):
            claim_name = f"{self.stem}-m{index}"
            await self.kube.create(CLAIMS, claim(claim_name, name, kind=self.kind), self.stage.namespace)
            self.claims.append(claim_name)
            got.append(str((await wait_address(self.kube, self.stage.namespace, claim_name))["spec"]["address"]))
        return got

    async def release(self) -> None:
        for claim_name in self.claims:
            await self.kube.delete(CLAIMS, claim_name, self.stage.namespace)
        for claim_name in self.claims:

            async def gone(claim_name: str = claim_name) -> bool:
                return await self.kube.get(ADDRESSES, claim_name, self.stage.namespace) is None

            await wait_for(gone, timeout=60, message=f"IPAddress {claim_name} to be deleted")
        self.claims = []

    async def cleanup(self) -> None:
        await self.release()
        for name in self.names:
            await self.kube.delete(self.resource, name, self.namespace)


async def outcome(write: Any) -> ApiError | None:
    """None if the API server accepted the awaitable `write`, else its refusal."""
    try:
        await write
    except ApiError as error:
        return error
    return None


def check(case: Case, step: str, error: ApiError | None) -> None:
    """The answer to one write, against the row's verdict for us."""
    if case.ours.accepted:
        assert error is None, f"{case.name} ({step}): Go accepts it ({case.go}), we refused: {error}"
        return
    assert error is not None, f"{case.name} ({step}): Go refuses it ({case.go.field}: {case.go.says}), we accepted"
    assert error.status in (400, 403, 422), (step, error)
    for text in (case.ours.field, case.ours.says, REFUSED_BY[case.by]):
        assert text in error.message, f"{case.name} ({step}): {text!r} not in {error.message!r}"
    if case.by != "webhook":  # the CRD refused it before the webhook was asked
        assert REFUSED_BY["webhook"] not in error.message, f"{case.name} ({step}): {error.message!r}"


@pytest.mark.apiserver
@pytest.mark.parametrize(("case", "kind"), runs())
async def test_our_verdict_matches_go(kube: KubeClient, stage: Stage, case: Case, kind: str) -> None:
    pools = Pools(kube, stage, kind, f"{SHORT[kind]}-{CASES.index(case):02d}")
    try:
        if case.op == "create":
            error = await outcome(pools.create("new", case.spec))
            check(case, "create", error)
            if kind in IP:  # Go checks each address-pool spec on UPDATE too
                base = await pools.create("upd", BASE_IP_SPEC)
                check(case, "update", await outcome(pools.respec(base, case.spec)))
        elif case.op == "update":
            assert case.old is not None
            name = await pools.create("upd", case.old)
            assert await pools.hold(name, len(case.held)) == list(case.held)
            check(case, "update", await outcome(pools.respec(name, case.spec)))
        else:
            name = await pools.create("del", case.spec, case.annotations)
            assert await pools.hold(name, len(case.held)) == list(case.held)
            if case.release:
                await pools.release()
            error = await outcome(kube.delete(pools.resource, name, pools.namespace))
            check(case, "delete", error)
            if error is None:
                pools.names.remove(name)
    finally:
        await pools.cleanup()
