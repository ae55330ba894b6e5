"""The controller in a pod's shoes: in-cluster configuration from a projected ServiceAccount token that is rotated
under it, as the kubelet rotates it, and whose first one expires while the controller runs.

The controller runs as the Deployment runs it (tests/support/deployment.py), except that it has no kubeconfig: it
finds the API server in KUBERNETES_SERVICE_HOST/PORT and its token and CA at
/var/run/secrets/kubernetes.io/serviceaccount/, which is a directory of the test bind-mounted there in a mount
namespace of the controller's own (`unshare`), so nothing on the host changes. The directory has the kubelet's
layout: `token` and `ca.crt` are symlinks into `..data`, which a rotation swaps atomically to a new directory.

TokenRequest refuses lifetimes under 10 minutes, so the first token is signed here with the control plane's
service-account key, with a TokenRequest token's claims but a lifetime of seconds; the next ones are TokenRequest
tokens. The test sees the API server refuse the first token before it asks anything more of the controller.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES, Resource
from tests.support.cluster import wait_for
from tests.support.deployment import LEASE, REPO, SYSTEM_NAMESPACE, ControllerProcess, Deployment, deployed
from tools.controlplane.cluster import LocalControlPlane

pytestmark = [pytest.mark.apiserver]

SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
SERVICE_ACCOUNT = "capi-ipam-controller-manager"
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
FIRST_TOKEN_SECONDS = 45
"""How long the first token is valid. The API server accepts a token up to a minute past its expiry (the JWT
library's leeway), so it is dated back by that minute: the test waits for the refusal, not for the clock."""
JWT_LEEWAY_SECONDS = 60


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def short_lived(token: str, signing_key: Path, seconds: int) -> str:
    """`token` (a TokenRequest token) with the same header and claims, but refused by the API server about
    `seconds` from now: signed anew with the control plane's service-account key."""
    header, claims, _ = token.split(".")
    now = int(time.time())
    expires = now + seconds - JWT_LEEWAY_SECONDS
    payload = {**_unb64(claims), "iat": expires - 10, "nbf": expires - 10, "exp": expires, "jti": str(uuid.uuid4())}
    signing_input = f"{header}.{_b64(json.dumps(payload).encode())}"
    key = serialization.load_pem_private_key(signing_key.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"


async def token_request(kube: KubeClient, seconds: int = 600) -> str:
    """A TokenRequest token of the controller's ServiceAccount, for the API server's audience."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}}
    answer = await kube.create_subresource(SERVICE_ACCOUNTS, SERVICE_ACCOUNT, "token", body, SYSTEM_NAMESPACE)
    return str(answer["status"]["token"])


@dataclass
class ProjectedVolume:
    """A directory laid out as the kubelet writes a projected service-account volume."""

    directory: Path
    ca: bytes
    generation: int = 0

    def project(self, token: str) -> None:
        """Put `token` in place as the kubelet does: a new timestamped directory, `..data` swapped to it by a
        rename, the old one removed."""
        self.generation += 1
        data = self.directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self.generation}"
        data.mkdir(parents=True)
        (data / "token").write_text(token)
        (data / "ca.crt").write_bytes(self.ca)
        (data / "namespace").write_text(SYSTEM_NAMESPACE)
        link = self.directory / "..data"
        previous = link.resolve() if link.is_symlink() else None
        staged = self.directory / "..data_tmp"
        staged.symlink_to(data.name)
        staged.replace(link)
        for name in ("token", "ca.crt", "namespace"):
            if not (self.directory / name).is_symlink():
                (self.directory / name).symlink_to(f"..data/{name}")
        if previous is not None:
            shutil.rmtree(previous)


@dataclass
class InClusterController(ControllerProcess):
    """The controller with in-cluster configuration: the API server from the environment, the service account's
    files at MOUNT_PATH from `volume`, in a mount namespace of its own. Its lease outlasts an API server restart."""

    volume: Path = Path()
    server_host: str = ""
    server_port: int = 0

    def argv(self) -> list[str]:
        arguments = [argument for argument in super().argv() if not argument.startswith("--kubeconfig")]
        arguments += ["--leader-elect-lease-duration=60s", "--leader-elect-renew-deadline=40s"]
        # /var/run/secrets does not exist on the host: a tmpfs over /var/run in the namespace gives it a place.
        mount = f'mount -t tmpfs tmpfs /var/run && mkdir -p {MOUNT_PATH} && mount --bind "$0" {MOUNT_PATH} && exec "$@"'
        unshare = ["unshare", "--mount", "--propagation=private"]
        if os.geteuid() != 0:
            unshare.append("--map-root-user")
        return [*unshare, "sh", "-c", mount, str(self.volume), *arguments]

    def start(self) -> None:
        home = self.log.parent / "home"  # no ~/.kube/config to prefer over the service account
        home.mkdir(exist_ok=True)
        environment = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
        environment |= {
            "HOME": str(home),
            "KUBERNETES_SERVICE_HOST": self.server_host,
            "KUBERNETES_SERVICE_PORT": str(self.server_port),
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=environment
            )


async def authenticates(plane: LocalControlPlane, token: str) -> bool:
    """Whether the API server takes `token` (anything but 401 to a request with it)."""
    assert plane.state is not None
    context = ssl.create_default_context(cafile=str(plane.state.ca_path))
    url = f"{plane.state.server}/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE}"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=context) as response:
        return response.status != 401


async def lease_spec(deployment: Deployment) -> dict[str, Any]:
    lease = await deployment.kube.get(LEASES, LEASE, SYSTEM_NAMESPACE)
    assert lease is not None
    return dict(lease["spec"])


def in_cluster_controller(deployment: Deployment, directory: Path, volume: Path) -> InClusterController:
    first = deployment.controller
    state = deployment.plane.state
    assert state is not None
    return InClusterController(
        first.kubeconfig,
        first.cert_dir,
        first.webhook_port,
        directory / "in-cluster-controller.log",
        volume=volume,
        server_host="127.0.0.1",
        server_port=state.apiserver_port,
    )


async def test_the_controller_serves_claims_after_its_first_token_expired(tmp_path: Path) -> None:
    async with deployed(tmp_path) as deployment:
        deployment.controller.stop()  # the kubeconfig one, which `deployed` started
        plane = deployment.plane
        assert plane.state is not None
        volume = ProjectedVolume(tmp_path / "serviceaccount", plane.state.ca_path.read_bytes())
        first = short_lived(
            await token_request(deployment.kube), plane.directory / "pki" / "sa.key", FIRST_TOKEN_SECONDS
        )
        assert await authenticates(plane, first), "the API server takes the short-lived token while it is valid"
        volume.project(first)
        controller = in_cluster_controller(deployment, tmp_path, volume.directory)
        deployment.controller = controller
        controller.start()
        try:
            await deployment.wait_leading()  # leading, and serving a new claim, with the first token
            leading = await lease_spec(deployment)
            volume.project(await token_request(deployment.kube))  # the kubelet's rotation

            async def first_refused() -> bool:
                return not await authenticates(plane, first)

            await wait_for(
                first_refused, timeout=FIRST_TOKEN_SECONDS + 60, interval=1, message="the first token's expiry"
            )
            # The watches the controller opened with the first token end; it must open them again with the new one.
            await asyncio.to_thread(plane.restart_apiserver)
            volume.project(await token_request(deployment.kube))  # and a rotation once more
            await deployment.wait_leading()  # a new claim served, with the new token
            now = await lease_spec(deployment)
            assert now["holderIdentity"] == leading["holderIdentity"], controller.tail()
            assert now.get("leaseTransitions") == leading.get("leaseTransitions")
            assert now["renewTime"] != leading["renewTime"], "the lease is renewed with the new tokens"
            assert controller.alive, controller.tail()
            refused = [line for line in controller.log.read_text().splitlines() if "Unauthorized" in line]
            assert not refused, "the controller sent a token the API server no longer takes:\n" + "\n".join(refused[:5])
        finally:
            controller.stop()
