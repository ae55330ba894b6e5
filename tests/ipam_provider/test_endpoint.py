"""What a Cluster's endpoint annotations ask for, read without an API server: defaults, the refusals of malformed
or hostile values, the claim's name and shape, and the patch that never overwrites what is set."""

from __future__ import annotations

import pytest

from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.common import Object
from ipam_provider.endpoint import (
    ANNOTATION_POOL_API_GROUP,
    ANNOTATION_POOL_KIND,
    ANNOTATION_POOL_NAME,
    ANNOTATION_PORT,
    ANNOTATION_VARIABLE,
    EndpointRefused,
    claim_name,
    endpoint_claim,
    endpoint_patch,
    requested_endpoint,
    set_address,
)
from ipam_provider.runtime.kube.resources import subdomain_problem

KINDS = [IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL]


def cluster(annotations: dict[str, str], **spec: object) -> Object:
    meta = {"name": "c1", "namespace": "team-a", "uid": "u1", "annotations": annotations}
    return {"metadata": meta, "spec": dict(spec)}


def test_defaults_and_a_cluster_scoped_pool() -> None:
    assert requested_endpoint(cluster({}), KINDS) is None
    request = requested_endpoint(cluster({ANNOTATION_POOL_NAME: " vips "}), KINDS)
    assert request is not None and (str(request.pool), request.port, request.variable) == (
        "InClusterIPPool/team-a/vips",
        6443,
        None,
    )
    annotations = {ANNOTATION_POOL_NAME: "vips", ANNOTATION_POOL_KIND: "GlobalInClusterIPPool", ANNOTATION_PORT: "443"}
    request = requested_endpoint(cluster(annotations), KINDS)
    assert request is not None and (str(request.pool), request.port) == ("GlobalInClusterIPPool/vips", 443)
    own_port = cluster(annotations, controlPlaneEndpoint={"port": 7443})
    assert (request := requested_endpoint(own_port, KINDS)) is not None and request.port == 7443


REFUSED: list[tuple[dict[str, str], dict[str, object], str, str]] = [
    ({ANNOTATION_POOL_NAME: ""}, {}, "EndpointSpecInvalid", "is not a DNS subdomain"),
    ({ANNOTATION_POOL_NAME: "Vips"}, {}, "EndpointSpecInvalid", "is not a DNS subdomain"),
    ({ANNOTATION_POOL_NAME: "a/b"}, {}, "PoolNamespaceNotAllowed", "a pool in another namespace"),
    ({ANNOTATION_POOL_NAME: "v", ANNOTATION_POOL_API_GROUP: "x.io"}, {}, "PoolKindNotServed", "'x.io'"),
    ({ANNOTATION_POOL_NAME: "v", ANNOTATION_PORT: "0"}, {}, "EndpointSpecInvalid", "is '0', which is not a port"),
    ({ANNOTATION_POOL_NAME: "v", ANNOTATION_PORT: "٣"}, {}, "EndpointSpecInvalid", "not a port"),
    ({ANNOTATION_POOL_NAME: "v", ANNOTATION_PORT: "65536"}, {}, "EndpointSpecInvalid", "not a port"),
    ({ANNOTATION_POOL_NAME: "v", ANNOTATION_VARIABLE: "a.b"}, {"topology": {}}, "EndpointSpecInvalid", "variable"),
    ({ANNOTATION_POOL_NAME: "v", ANNOTATION_VARIABLE: "vip"}, {}, "EndpointSpecInvalid", "has no spec.topology"),
    ({ANNOTATION_POOL_NAME: "v"}, {"controlPlaneEndpoint": "x"}, "EndpointSpecInvalid", "not an object"),
    ({ANNOTATION_POOL_NAME: "v"}, {"controlPlaneEndpoint": {"host": 5}}, "EndpointSpecInvalid", "not a string"),
    ({ANNOTATION_POOL_NAME: "v"}, {"controlPlaneEndpoint": {"port": "x"}}, "EndpointSpecInvalid", "not a port"),
]


@pytest.mark.parametrize(("annotations", "spec", "reason", "text"), REFUSED)
def test_refusals(annotations: dict[str, str], spec: dict[str, object], reason: str, text: str) -> None:
    with pytest.raises(EndpointRefused) as refused:
        requested_endpoint(cluster(annotations, **spec), KINDS)
    assert refused.value.reason == reason and text in refused.value.message


def test_a_host_set_is_reserved_only_when_it_is_an_address() -> None:
    assert set_address(cluster({}, controlPlaneEndpoint={"host": " 10.0.0.1 "})) == "10.0.0.1"
    assert set_address(cluster({}, controlPlaneEndpoint={"port": 6443})) is None
    assert set_address(cluster({}, controlPlaneEndpoint={"host": "fd00::0:1"})) == "fd00::1"
    with pytest.raises(EndpointRefused) as refused:
        set_address(cluster({}, controlPlaneEndpoint={"host": "api.example.com"}))
    assert refused.value.reason == "EndpointNotAnAddress"


def test_claim_names_stay_names() -> None:
    assert claim_name("c1") == "c1-control-plane-endpoint"
    long = "a" * 250
    assert claim_name(long) != claim_name("a" * 249) and subdomain_problem(claim_name(long)) is None
    assert claim_name(long).endswith("-control-plane-endpoint")


def test_the_claim_is_owned_by_the_cluster_and_asks_for_a_set_address() -> None:
    obj = cluster({ANNOTATION_POOL_NAME: "vips"})
    request = requested_endpoint(obj, KINDS)
    assert request is not None
    body = endpoint_claim(obj, request, "10.0.0.7")
    assert body["metadata"]["annotations"] == {REQUESTED_ADDRESS_ANNOTATION: "10.0.0.7"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["spec"] == {
        "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "vips"},
        "clusterName": "c1",
    }


def test_the_patch_never_overwrites() -> None:
    annotations = {ANNOTATION_POOL_NAME: "vips", ANNOTATION_VARIABLE: "vip"}
    topology = {"classRef": {"name": "c"}, "version": "v1", "variables": [{"name": "vip", "value": "10.9.9.9"}]}
    done = cluster(annotations, controlPlaneEndpoint={"host": "10.0.0.1", "port": 6443}, topology=topology)
    request = requested_endpoint(done, KINDS)
    assert request is not None and endpoint_patch(done, request, "10.0.0.2") is None
    empty = cluster(annotations, topology={**topology, "variables": [{"name": "vip", "value": ""}]})
    assert endpoint_patch(empty, request, "10.0.0.2") == {
        "spec": {
            "controlPlaneEndpoint": {"host": "10.0.0.2", "port": 6443},
            "topology": {"variables": [{"name": "vip", "value": "10.0.0.2"}]},
        }
    }
