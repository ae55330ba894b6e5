"""The CAPI IPAM contract, step by step, against the real API server with the in-cluster backend.

The flow itself is in tests/support/contract.py; tests/system/test_capi_releases.py runs the same flow against every
Cluster API release of the compatibility matrix.
"""

from __future__ import annotations

from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.contract import contract_flow


async def test_claim_is_fulfilled_and_released(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await contract_flow(kube, namespace, in_process_controller)
