"""The owner walk that names a host record after the claim's Machine (backends/infoblox/hostname.py): only owners
of known infrastructure kinds are read, in the claim's namespace, within bounds on depth, reads and time; a Machine
is read and its uid checked; whatever cannot be read is the claim's error, never a guessed name. The Kubernetes
client is a dict of objects that records every GET (no API server)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from backends.infoblox.hostname import HostnameError, OwnerBounds, machine_name
from ipam_provider.backend.contract import ClaimContext
from ipam_provider.runtime.kube.errors import ApiError

INFRA = "infrastructure.cluster.x-k8s.io/v1beta1"
CAPI = "cluster.x-k8s.io/v1beta2"
Object = dict[str, Any]


class OwnerKube:
    """`get` from {(plural, namespace, name): object or ApiError}; every GET is recorded in `gets`."""

    def __init__(self, objects: dict[tuple[str, str, str], Object | ApiError], delay: float = 0.0) -> None:
        self.objects = objects
        self.delay = delay
        self.gets: list[tuple[str, str, str, str | None]] = []

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Object | None:
        resource.path(namespace, name)  # the real client's name checks
        self.gets.append((resource.group, resource.plural, name, namespace))
        await asyncio.sleep(self.delay)
        found = self.objects.get((resource.plural, str(namespace), name))
        if isinstance(found, ApiError):
            raise found
        return found


def ref(api_version: str, kind: str, name: str, uid: str | None = None, controller: bool = False) -> Object:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid or f"uid-{name}",
        "controller": controller,
    }


def obj(name: str, *owners: Object, uid: str | None = None) -> Object:
    return {"metadata": {"name": name, "namespace": "team", "uid": uid or f"uid-{name}", "ownerReferences": [*owners]}}


def claim(*owners: Object) -> ClaimContext:
    return ClaimContext("team", "c-eth0", "claim-uid", owner_references=list(owners))


async def walk(kube: OwnerKube, context: ClaimContext, bounds: OwnerBounds | None = None) -> str:
    return await machine_name(cast(Any, kube), context, bounds or OwnerBounds())


MACHINE = ref(CAPI, "Machine", "md-0-x7k2p", controller=True)


@pytest.mark.parametrize(
    "chain",
    [
        # CAPV: claim <- VSphereVM <- VSphereMachine <- Machine
        [("vspherevms", "VSphereVM"), ("vspheremachines", "VSphereMachine")],
        # CAPMOX: claim <- ProxmoxMachine <- Machine
        [("proxmoxmachines", "ProxmoxMachine")],
        # CAPM3: claim <- Metal3Data <- Metal3DataClaim <- Metal3Machine <- Machine
        [("metal3datas", "Metal3Data"), ("metal3dataclaims", "Metal3DataClaim"), ("metal3machines", "Metal3Machine")],
    ],
)
async def test_the_providers_chains_reach_the_machine_read_in_the_claims_namespace(
    chain: list[tuple[str, str]],
) -> None:
    objects: dict[tuple[str, str, str], Object | ApiError] = {
        ("machines", "team", MACHINE["name"]): obj(MACHINE["name"])
    }
    owner = MACHINE
    for plural, kind in reversed(chain):
        objects[(plural, "team", f"{kind.lower()}-0")] = obj(f"{kind.lower()}-0", owner)
        owner = ref(INFRA, kind, f"{kind.lower()}-0", controller=True)
    kube = OwnerKube(objects)
    assert await walk(kube, claim(owner)) == "md-0-x7k2p"
    assert [plural for _, plural, _, _ in kube.gets] == [plural for plural, _ in chain] + ["machines"]
    assert {namespace for *_, namespace in kube.gets} == {"team"}


async def test_owners_of_other_kinds_and_bad_names_are_never_read() -> None:
    kube = OwnerKube({})
    hostile = claim(
        ref("v1", "Secret", "netbox"),
        ref("v1", "ConfigMap", "infra-vm", controller=True),
        ref("v1beta2", "IPAddressClaim", "../../v1beta2/namespaces/victim/ipaddressclaims/c"),
        ref("infrastructure.cluster.x-k8s.io/v1beta1", "VSphereVM", "../../../../api/v1/secrets/x"),
    )
    with pytest.raises(HostnameError, match="malformed") as caught:
        await walk(kube, hostile)
    assert kube.gets == [], "nothing is read for owners of other kinds, nor for names that are no object names"
    assert "claimName" in str(caught.value)
    with pytest.raises(HostnameError, match="not followed: ConfigMap 'infra-vm' of an unknown kind"):
        await walk(kube, claim(ref("v1", "ConfigMap", "infra-vm", controller=True)))
    assert kube.gets == []


async def test_a_machine_is_read_and_must_be_the_one_the_reference_names() -> None:
    kube = OwnerKube({("machines", "team", "md-0-x7k2p"): obj("md-0-x7k2p", uid="a-newer-machine")})
    with pytest.raises(HostnameError, match="another uid"):
        await walk(kube, claim(MACHINE))
    with pytest.raises(HostnameError, match="was not found"):
        await walk(kube, claim(ref(CAPI, "Machine", "made-up", controller=True)))
    assert [name for _, _, name, _ in kube.gets] == ["md-0-x7k2p", "made-up"]


async def test_an_owner_that_cannot_be_read_is_the_claims_error() -> None:
    forbidden = ApiError(403, "Forbidden", "vspherevms is forbidden")
    kube = OwnerKube({("vspherevms", "team", "vm-0"): forbidden})
    with pytest.raises(HostnameError, match=r"VSphereVM team/vm-0 cannot be read \(403 Forbidden\)"):
        await walk(kube, claim(ref(INFRA, "VSphereVM", "vm-0", controller=True), MACHINE))


async def test_reads_depth_and_time_are_bounded() -> None:
    many = [ref(INFRA, "VSphereVM", f"vm-{i}") for i in range(200)]
    wide = OwnerKube({("vspherevms", "team", f"vm-{i}"): obj(f"vm-{i}") for i in range(200)})
    with pytest.raises(HostnameError, match="more than 3 owners"):
        await walk(wide, claim(*many), OwnerBounds(reads=3))
    assert len(wide.gets) == 3

    deep_objects: dict[tuple[str, str, str], Object | ApiError] = {
        ("vspherevms", "team", f"vm-{i}"): obj(f"vm-{i}", ref(INFRA, "VSphereVM", f"vm-{i + 1}")) for i in range(50)
    }
    deep = OwnerKube(deep_objects)
    with pytest.raises(HostnameError, match="no Machine within 4 ownerReferences"):
        await walk(deep, claim(ref(INFRA, "VSphereVM", "vm-0")), OwnerBounds(depth=4))
    assert len(deep.gets) == 4

    slow = OwnerKube({("vspherevms", "team", "vm-0"): obj("vm-0", MACHINE)}, delay=5.0)
    started = asyncio.get_running_loop().time()
    with pytest.raises(HostnameError, match=r"took over 0\.2 s"):
        await walk(slow, claim(ref(INFRA, "VSphereVM", "vm-0")), OwnerBounds(seconds=0.2))
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_a_claim_without_owners_gets_no_name() -> None:
    kube = OwnerKube({})
    with pytest.raises(HostnameError, match=r"no cluster\.x-k8s\.io Machine among its owners"):
        await walk(kube, claim())
