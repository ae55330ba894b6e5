"""The provider deployed as `config/default` deploys it, on a control plane of its own with the audit log on.

`deployed(directory)` (an async context manager) starts a dedicated kube-apiserver + etcd with its audit log
(tools/controlplane), installs the Cluster API CRDs and cert-manager's, applies `config/default` with kubectl
(CRDs, RBAC, the ValidatingWebhookConfiguration), and runs the controller as the Deployment runs it: a separate
process, `ipam-provider run --leader-elect`, watching every namespace, authenticated as the provider's
ServiceAccount (so config/rbac is all it may do, and its requests are that user's in the audit log), serving the
webhook with a certificate of its own. What cert-manager's CA injector and the webhook Service do in a cluster is
done here by hand: each webhook's caBundle is the test CA, and its clientConfig the controller's URL on 127.0.0.1
(there are no Pods), every other field as config/default has it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ipam_provider.api.capi import CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import LEASES, NAMESPACES, Resource
from tests.support.audit import AuditLog
from tests.support.cluster import dedicated_control_plane, wait_for
from tests.support.metrics import install_cert_manager_crds
from tests.support.objects import POOLS, claim, pool, wait_address
from tests.system.test_examples import CONFIG, kubectl_against
from tools.controlplane.assets import capi_crd_paths, our_crd_paths
from tools.controlplane.cluster import CONTROLLER_USER, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.pki import write_pki
from tools.controlplane.versions import load_versions

REPO = Path(__file__).resolve().parents[2]
SYSTEM_NAMESPACE = "capi-ipam-system"
LEASE = "capi-ipam-provider-py"
WEBHOOK_CONFIGURATION = "capi-ipam-validating-webhook-configuration"
WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False
)
PROBE_NAMESPACE = "deployment-probe"
Object = dict[str, Any]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ControllerProcess:
    """`ipam-provider run` as config/manager's Deployment runs it, as its own process, logging JSON to `log`."""

    kubeconfig: Path
    cert_dir: Path
    webhook_port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ipam_provider",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect",
            f"--leader-election-namespace={SYSTEM_NAMESPACE}",
            "--diagnostics-address=0",
            "--health-probe-bind-address=0",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-cert-dir={self.cert_dir}",
            "--log-format=json",
        ]

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
            )

    def stop(self) -> None:
        """SIGTERM (as the kubelet sends), SIGKILL after 15 s."""
        if self.process is None:
            return
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


@dataclass
class Deployment:
    """The provider as deployed: the control plane, an admin client, the controller, the webhook registration."""

    plane: LocalControlPlane
    kube: KubeClient
    controller: ControllerProcess
    ca: bytes
    audit: AuditLog
    shipped_webhooks: list[Object] = field(default_factory=list)

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.controller.webhook_port}"

    @property
    def user(self) -> str:
        """The controller's identity, as the audit log names it."""
        return CONTROLLER_USER

    def configuration(self) -> Object:
        """config/default's ValidatingWebhookConfiguration, with the CA injected and the URL in place of the
        Service."""
        webhooks = copy.deepcopy(self.shipped_webhooks)
        for webhook in webhooks:
            path = webhook["clientConfig"]["service"]["path"]
            bundle = base64.b64encode(self.ca).decode()
            webhook["clientConfig"] = {"url": f"{self.webhook_url}{path}", "caBundle": bundle}
        return {"webhooks": webhooks}

    async def register_webhook(self) -> None:
        """Put the webhook configuration in place, and wait until the API server calls the webhook."""
        existing = await self.kube.get(WEBHOOK_CONFIGURATIONS, WEBHOOK_CONFIGURATION)
        if existing is None:
            body = {"metadata": {"name": WEBHOOK_CONFIGURATION}, **self.configuration()}
            await self.kube.create(WEBHOOK_CONFIGURATIONS, body)
        else:
            await self.kube.patch(WEBHOOK_CONFIGURATIONS, WEBHOOK_CONFIGURATION, self.configuration())
        await wait_for(lambda: _probe_refused(self.kube), timeout=60, interval=0.5, message="the webhook in force")

    async def unregister_webhook(self) -> None:
        """Remove the webhook configuration, and wait until the API server stops calling the webhook."""
        await self.kube.delete(WEBHOOK_CONFIGURATIONS, WEBHOOK_CONFIGURATION)

        async def out_of_force() -> bool:
            return not await _probe_refused(self.kube)

        await wait_for(out_of_force, timeout=60, interval=0.5, message="the webhook out of force")

    async def kubectl(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        """kubectl as the admin: (exit code, stdout, stderr). It sends what KubeClient cannot (orjson refuses
        documents nested more than 254 levels)."""
        return await kubectl_against(self.plane.kubeconfig_path, *args, stdin=stdin)

    async def restart_controller(self) -> None:
        self.controller.stop()
        self.controller.start()
        await self.wait_leading()

    async def wait_leading(self) -> None:
        """Wait until the controller holds the lease and serves a new claim in the probe namespace."""

        async def leading() -> bool:
            if not self.controller.alive:
                pytest.fail(f"the controller exited:\n{self.controller.tail()}", pytrace=False)
            lease = await self.kube.get(LEASES, LEASE, SYSTEM_NAMESPACE)
            return bool(((lease or {}).get("spec") or {}).get("holderIdentity"))

        await wait_for(leading, timeout=60, interval=0.3, message=lambda: f"the lease\n{self.controller.tail()}")
        name = f"probe-{time.monotonic_ns()}"
        await self.kube.create(CLAIMS, claim(name, "probe"), PROBE_NAMESPACE)
        try:
            await wait_address(self.kube, PROBE_NAMESPACE, name, timeout=60)
        except BaseException:
            print(self.controller.tail())
            raise


async def _probe_refused(kube: KubeClient) -> bool:
    """Whether an in-cluster pool the webhook refuses (addresses of two subnets) is refused now."""
    probe = pool("webhook-probe", ["10.9.0.5", "10.9.1.5"], 24)
    try:
        await kube.create(POOLS, probe, PROBE_NAMESPACE)
    except ApiError as error:
        return "denied the request" in error.message
    await kube.delete(POOLS, "webhook-probe", PROBE_NAMESPACE)
    return False


async def _apply_config_default(plane: LocalControlPlane, kube: KubeClient) -> list[Object]:
    """Install the CRDs, make the probe pool (before the webhook, which would refuse it without its controller),
    and `kubectl apply --server-side -k config/default`; return the shipped webhooks."""
    await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
    await install_cert_manager_crds(kube)
    await kube.create(NAMESPACES, {"metadata": {"name": PROBE_NAMESPACE}})
    await kube.create(POOLS, pool("probe", ["10.255.0.0/16"], 16), PROBE_NAMESPACE)
    apply = ("apply", "--server-side", "--force-conflicts", "-k", str(CONFIG / "default"))
    code, _, err = await kubectl_against(plane.kubeconfig_path, *apply)
    assert code == 0, f"kubectl apply -k config/default failed:\n{err}"
    shipped = await kube.get(WEBHOOK_CONFIGURATIONS, WEBHOOK_CONFIGURATION)
    assert shipped is not None, "config/default has no ValidatingWebhookConfiguration"
    return list(shipped["webhooks"])


def _controller_kubeconfig(plane: LocalControlPlane, directory: Path) -> Path:
    document = json.loads(plane.kubeconfig_path.read_text())
    path = directory / "controller.kubeconfig"
    path.write_text(json.dumps({**document, "current-context": "controller"}))
    path.chmod(0o600)
    return path


def _serving_certificate(directory: Path) -> tuple[Path, bytes]:
    """A CA and a certificate for 127.0.0.1 in --webhook-cert-dir's layout (tls.crt, tls.key); the CA's PEM."""
    directory.mkdir(parents=True)
    paths = write_pki(directory)
    certs = directory / "serving-certs"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(paths["cert"].read_bytes())
    (certs / "tls.key").write_bytes(paths["key"].read_bytes())
    return certs, paths["ca"].read_bytes()


@contextlib.asynccontextmanager
async def deployed(directory: Path) -> AsyncIterator[Deployment]:
    """The provider deployed as config/default deploys it, the webhook registered and the controller leading."""
    with dedicated_control_plane(audit=True) as plane:
        kube = await KubeClient.from_kubeconfig(str(plane.kubeconfig_path))
        try:
            shipped = await _apply_config_default(plane, kube)
            cert_dir, ca = _serving_certificate(directory / "webhook-pki")
            controller = ControllerProcess(
                _controller_kubeconfig(plane, directory), cert_dir, _free_port(), directory / "controller.log"
            )
            deployment = Deployment(plane, kube, controller, ca, AuditLog(plane.audit_log_path), shipped)
            controller.start()
            try:
                await deployment.register_webhook()
                await deployment.wait_leading()
                yield deployment
            finally:
                controller.stop()
        finally:
            await kube.close()
