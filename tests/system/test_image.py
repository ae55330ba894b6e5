"""The controller image, built for real from the Dockerfile, serves a claim as its non-root user.

There is no Docker engine and no image registry here. `hack/image/build.sh` (`make docker-build`) builds the
Dockerfile with buildah on a local Debian base (`hack/image/base.sh`: debootstrap, cached under
~/.cache/ipam-provider/image/ by release), passed as the PYTHON_IMAGE build argument in place of the digest-pinned
python:3.11-slim. Containers cannot be started here either (runc and crun are refused setrlimit), so the test mounts
the image's root filesystem (`buildah from` + `buildah mount`), read-only as the Deployment has it, with /proc, the
/dev nodes a process needs and a tmpfs on /tmp, and runs the image's own entrypoint, command, environment and user
there with chroot: uid 65532, with the Deployment's flags, against the session's kube-apiserver, authenticated as
the controller's ServiceAccount with only the grants of config/rbac. It must fulfil an IPAddressClaim, answer
/readyz, /metrics (over HTTPS, to a metrics reader's token) and its admission webhook, and exit 0 on SIGTERM.

Nothing is skipped: if buildah or debootstrap is missing or fails, the fixture fails with its output. Both tests
carry the `apiserver` mark by hand, so the fast lane leaves them out: a cold build takes minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import LEASES
from tests.support.cluster import wait_for
from tests.support.metrics import install_cert_manager_crds, scrape
from tests.support.objects import POOLS, claim, pool, wait_address
from tests.system.test_examples import CONFIG, SYSTEM_NAMESPACE, kubectl_against
from tests.system.test_rbac import remove_bindings, remove_webhook_configuration, status_of

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "image" / "build.sh"
IMAGE = "localhost/capi-ipam-provider-py:test"
# The device nodes a Python process may open; bound from the host onto the image's (or empty files made for them).
DEVICES = ("null", "zero", "random", "urandom")
# Inside the chroot: where the test puts the ServiceAccount kubeconfig and the API server's CA.
SECRETS = "/tmp/ipam-image-test"

pytestmark = [pytest.mark.apiserver, pytest.mark.image, pytest.mark.timeout(1500)]


@dataclass(frozen=True)
class Image:
    name: str
    base: str
    config: dict[str, Any]  # the OCI image config's `config`: User, Env, Entrypoint, Cmd, Labels, ...


def run(*command: str, timeout: float = 120) -> str:
    """Run a command; fail the test with its output if it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"{' '.join(command)}: {error}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}", pytrace=False)
    return done.stdout


@pytest.fixture(scope="module")
def image() -> Image:
    """The image, built by `hack/image/build.sh` on the local Debian base (installs buildah and debootstrap when
    they are missing; cold: debootstrap and pip install, minutes; warm: every layer cached, seconds)."""
    if os.geteuid() != 0:
        pytest.fail("the image test needs root (buildah storage, mount, chroot)", pytrace=False)
    started = time.monotonic()
    environment = {**os.environ, "IMAGE_BASE": "debian", "IMAGE": IMAGE}
    try:
        done = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=1200, check=False, env=environment)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"{BUILD} (buildah, debootstrap): {error}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"the image build failed ({BUILD} exited {done.returncode}; it needs buildah and debootstrap, Debian "
            f"packages it installs as root when missing, PyPI and the Debian mirror):\n{done.stderr[-6000:]}",
            pytrace=False,
        )
    print(f"\nimage {IMAGE} built in {time.monotonic() - started:.1f} s:\n{done.stderr.strip()}")
    inspected = json.loads(run("buildah", "inspect", "--type", "image", IMAGE))
    base = inspected["OCIv1"]["config"].get("Labels", {}).get("org.opencontainers.image.base.name", "")
    return Image(IMAGE, base, inspected["OCIv1"]["config"])


@pytest.fixture(scope="module")
def rootfs(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's root filesystem as the Deployment runs it: mounted from a working container and bound read-only
    (readOnlyRootFilesystem), with /proc, the /dev nodes and a tmpfs on /tmp (the Deployment's emptyDir). Every
    mount and the container are removed afterwards."""
    name = f"ipam-image-test-{secrets.token_hex(4)}"
    container = run("buildah", "from", "--pull=false", "--name", name, image.name).strip()
    mounted: list[Path] = []
    try:
        files = Path(run("buildah", "mount", container).strip())
        for device in DEVICES:  # mount points for the device nodes, where the base has none
            if not (files / "dev" / device).exists():
                (files / "dev" / device).touch()
        root = tmp_path_factory.mktemp("image-root")
        run("mount", "--bind", str(files), str(root))
        mounted.append(root)
        run("mount", "-o", "remount,bind,ro", str(root))
        assert os.statvfs(root).f_flag & os.ST_RDONLY, f"{root} is not read-only"
        run("mount", "-t", "proc", "proc", str(root / "proc"))
        mounted.append(root / "proc")
        for device in DEVICES:
            run("mount", "--bind", f"/dev/{device}", str(root / "dev" / device))
            mounted.append(root / "dev" / device)
        run("mount", "-t", "tmpfs", "-o", "mode=1777,size=16m", "tmpfs", str(root / "tmp"))
        mounted.append(root / "tmp")
        yield root
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", str(target)], check=False)
        subprocess.run(["buildah", "umount", container], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def dockerfile_python() -> str:
    """The Python minor version of the Dockerfile's default base (python:3.11-slim@sha256:...)."""
    found = re.search(
        r"^ARG PYTHON_IMAGE=(?:docker\.io/library/)?python:(\d+\.\d+)-slim@", (REPO / "Dockerfile").read_text(), re.M
    )
    assert found, "the Dockerfile's default PYTHON_IMAGE is not python:<version>-slim@<digest>"
    return found.group(1)


def test_the_image_is_what_the_dockerfile_says(image: Image, rootfs: Path) -> None:
    config = image.config
    assert config.get("User") == "65532:65532"
    assert config.get("Entrypoint") == ["ipam-provider"] and config.get("Cmd") == ["run"]
    assert config.get("WorkingDir") == "/"
    assert set(config.get("ExposedPorts", {})) == {"8443/tcp", "8081/tcp"}
    labels = config.get("Labels", {})
    assert labels.get("org.opencontainers.image.title") == "capi-ipam-provider-py"
    assert image.base.startswith("localhost/ipam-provider-base:"), f"built on {image.base!r}, not the local base"
    env = dict(entry.split("=", 1) for entry in config.get("Env", []))
    assert env["PATH"].startswith("/opt/venv/bin:"), env

    # The local base stands in for python:3.11-slim: the same Python minor version.
    venv = (rootfs / "opt/venv/pyvenv.cfg").read_text()
    assert re.search(rf"^version\s*=\s*{re.escape(dockerfile_python())}\.", venv, re.M), venv
    # The package is installed (not editable) with its licence and the three backends' entry points.
    (dist,) = (rootfs / "opt/venv/lib").glob("python3.*/site-packages/capi_ipam_provider_py-*.dist-info")
    assert (dist / "licenses" / "LICENSE").is_file(), "the installed package carries no LICENSE"
    entry_points = (dist / "entry_points.txt").read_text()
    for backend in ("incluster", "netbox", "infoblox"):
        assert re.search(rf"^{backend} = backends\.{backend}:create_backend$", entry_points, re.M), entry_points
    direct_url = dist / "direct_url.json"
    assert not direct_url.exists() or '"editable": true' not in direct_url.read_text(), "an editable install"

    # No source tree, no compiler, no pip cache; the virtualenv belongs to root and the image's user cannot change it.
    assert not (rootfs / "src").exists(), "the source tree is in the run-time image"
    assert not any((rootfs / "usr/bin" / cc).exists() for cc in ("gcc", "cc", "g++")), "a compiler is in the image"
    assert not (rootfs / "root/.cache/pip").exists()
    venv_stat = (rootfs / "opt/venv").stat()
    assert venv_stat.st_uid == 0 and not venv_stat.st_mode & 0o022
    passwd = (rootfs / "etc/passwd").read_text()
    assert re.search(r"^nonroot:x:65532:65532:", passwd, re.M), "no nonroot user 65532 in /etc/passwd"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def install_service_account_kubeconfig(kubeconfig: Path, root: Path, host_copy: Path) -> str:
    """Write the controller ServiceAccount's kubeconfig (the session kubeconfig's `controller` context: a token
    that authenticates as system:serviceaccount:capi-ipam-system:capi-ipam-controller-manager) into the image's
    /tmp (a tmpfs) with the API server's CA, readable by uid 65532 only, and a host copy for the test's own
    client. Returns the path inside the chroot."""
    document = yaml.safe_load(kubeconfig.read_text())
    if "controller" not in {c["name"] for c in document.get("contexts", [])}:
        pytest.fail(f"{kubeconfig} has no `controller` context (see tools/controlplane/cluster.py)", pytrace=False)
    (cluster,) = document["clusters"]
    ca = Path(cluster["cluster"]["certificate-authority"])
    host_copy.write_text(json.dumps({**document, "current-context": "controller"}))
    directory = root / SECRETS.lstrip("/")
    directory.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(ca, directory / "ca.crt")
    cluster["cluster"]["certificate-authority"] = f"{SECRETS}/ca.crt"
    (directory / "kubeconfig").write_text(json.dumps({**document, "current-context": "controller"}))
    for path in (directory, directory / "ca.crt", directory / "kubeconfig"):
        os.chown(path, 65532, 65532)
    (directory / "ca.crt").chmod(0o600)
    (directory / "kubeconfig").chmod(0o600)
    return f"{SECRETS}/kubeconfig"


def proc_ids(pid: int, field: str) -> set[str]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return set(line.split()[1:])
    return set()


async def http_get(url: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(5)) as reply:
            return reply.status, await reply.text()
    except (aiohttp.ClientError, TimeoutError) as error:
        return 0, str(error)


def deployment_flags(kubeconfig: str, namespace: str, lease: str, metrics: int, health: int, webhook: int) -> list[str]:
    """The Deployment's flags (config/manager/manager.yaml), with this test's namespace, lease and free ports."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--leader-elect",
        f"--leader-election-namespace={SYSTEM_NAMESPACE}",
        f"--leader-election-id={lease}",
        f"--diagnostics-address=127.0.0.1:{metrics}",
        "--metrics-cert-path=/tmp/k8s-metrics-server/metrics-certs",  # absent here: the self-signed certificate
        f"--health-probe-bind-address=127.0.0.1:{health}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={webhook}",
        "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs",  # absent here: the self-signed certificate
        "--log-format=json",
    ]


async def install_config_default(kube: KubeClient, kubeconfig: Path, as_controller: KubeClient, namespace: str) -> None:
    """`kubectl apply --server-side -k config/default` (as config/README.md says, and as tests/system/test_rbac.py
    applies it to the same API server: a client-side apply here would own fields that its apply then conflicts on),
    and wait until its RBAC lets the controller's ServiceAccount work."""
    await remove_bindings(kube)  # should an earlier run have left them: the grants come from config/rbac below
    await install_cert_manager_crds(kube)  # config/default holds the metrics endpoint's Certificate
    code, _, err = await kubectl_against(kubeconfig, "apply", "--server-side", "-k", str(CONFIG / "default"))
    try:
        assert code == 0, f"kubectl apply --server-side -k config/default failed:\n{err}"
    finally:
        await remove_webhook_configuration(kube)

    async def granted() -> bool:
        return await status_of(as_controller.list(CLAIMS, namespace)) == 200

    await wait_for(granted, message="config/rbac to let the controller's ServiceAccount list claims")


async def a_claim_is_served_scraped_and_released(
    kube: KubeClient, namespace: str, metrics_url: str, token: str, output: Callable[[], str]
) -> None:
    await kube.create(POOLS, pool("net", ["10.40.0.0/24"], 24, gateway="10.40.0.1"), namespace)
    await kube.create(CLAIMS, claim("m1", "net"), namespace)
    address = await wait_address(kube, namespace, "m1", timeout=60)
    assert address["spec"]["address"] == "10.40.0.2", address
    assert address["spec"]["claimRef"]["name"] == "m1"
    fulfilled = await kube.get(CLAIMS, "m1", namespace)
    assert fulfilled is not None and fulfilled["status"]["addressRef"]["name"] == "m1"

    # HTTPS, the token reviewed by the API server as the controller's ServiceAccount (config/rbac's grants).
    status, text = await scrape(metrics_url, token)
    assert status == 200 and "ipam_provider_allocation_total{" in text, text[:2000]

    await kube.delete(CLAIMS, "m1", namespace)
    await kube.delete(POOLS, "net", namespace)

    async def released() -> bool:
        return all(
            [
                await kube.get(CLAIMS, "m1", namespace) is None,
                await kube.get(ADDRESSES, "m1", namespace) is None,
                await kube.get(POOLS, "net", namespace) is None,
            ]
        )

    await wait_for(released, timeout=60, message=lambda: f"the claim and pool to be released:\n{output()}")


async def test_the_image_serves_a_claim_as_its_nonroot_user(
    image: Image,
    rootfs: Path,
    kube: KubeClient,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    metrics_reader_token: str,
) -> None:
    config = image.config
    user = config["User"]
    assert user == "65532:65532"
    host_kubeconfig = tmp_path / "controller.kubeconfig"
    inside_kubeconfig = install_service_account_kubeconfig(kubeconfig, rootfs, host_kubeconfig)
    as_controller = await KubeClient.from_kubeconfig(str(host_kubeconfig))
    metrics, health, webhook = free_port(), free_port(), free_port()
    lease = f"image-test-{secrets.token_hex(4)}"
    args = deployment_flags(inside_kubeconfig, namespace, lease, metrics, health, webhook)
    log_path = tmp_path / "controller.log"
    process: asyncio.subprocess.Process | None = None

    def output() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        await install_config_default(kube, kubeconfig, as_controller, namespace)
        env = dict(entry.split("=", 1) for entry in config.get("Env", []))
        command = [*config["Entrypoint"], *config["Cmd"], *args]
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                "chroot", f"--userspec={user}", str(rootfs), *command, env=env, stdout=log, stderr=log
            )

        async def ready() -> bool:
            assert process is not None
            assert process.returncode is None, f"the controller exited {process.returncode}:\n{output()}"
            status, _ = await http_get(f"http://127.0.0.1:{health}/readyz")
            return status == 200

        await wait_for(ready, timeout=60, interval=0.25, message=lambda: f"/readyz to answer 200:\n{output()}")
        # The controller (chroot execs it, so this is the Python process) runs as the image's user, not as root.
        assert proc_ids(process.pid, "Uid") == {"65532"}, proc_ids(process.pid, "Uid")
        assert proc_ids(process.pid, "Gid") == {"65532"}, proc_ids(process.pid, "Gid")
        assert os.readlink(f"/proc/{process.pid}/root") == str(rootfs), "not in the image's root filesystem"
        maps = await asyncio.to_thread(Path(f"/proc/{process.pid}/maps").read_text)
        assert "/libjemalloc.so.2" in maps, "the controller does not run under jemalloc (the Dockerfile's ENV)"

        # The admission webhook serves in the image too (its certificate self-signed here): a body that is no
        # review is answered 400.
        webhook_url = f"https://127.0.0.1:{webhook}/validate-ipam-cluster-x-k8s-io-v1alpha2-inclusterippool"
        async with aiohttp.ClientSession() as session, session.post(webhook_url, data=b"{}", ssl=False) as reply:
            assert reply.status == 400 and "malformed AdmissionReview" in await reply.text()

        url = f"https://127.0.0.1:{metrics}/metrics"
        await a_claim_is_served_scraped_and_released(kube, namespace, url, metrics_reader_token, output)

        process.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(process.wait(), 30)
        assert returncode == 0, f"the controller exited {returncode} on SIGTERM:\n{output()}"
    finally:
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        await as_controller.close()
        await remove_bindings(kube)  # leave the ServiceAccount as powerless as the other tests expect it
        await kube.delete(LEASES, lease, SYSTEM_NAMESPACE)
