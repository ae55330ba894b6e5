"""`python -m tools.controlplane up|down|env [--dir DIR]`: a local control plane for development.

`up` builds (or reuses) the binaries, starts etcd and kube-apiserver detached, installs the Cluster API CRDs and
ours, and prints `export KUBECONFIG=…`; an instance recorded in DIR whose processes are gone is replaced.
`install-crds --external` installs into a cluster this tool did not start: Cluster API's CRDs only where
absent, and nothing with force. `down` stops the instance recorded in DIR and removes DIR. `capi-crds` fetches
the Cluster API modules of every release in CAPI_COMPAT_VERSIONS and the cert-manager module of CERT_MANAGER_VERSION
(hack/versions.env) into the Go module cache and prints where each one's CRDs are.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from ipam_provider.runtime.kube.client import KubeClient
from tools.controlplane.assets import (
    AssetError,
    binaries_dir,
    capi_crd_paths,
    capi_crd_paths_of,
    cert_manager_crd_paths,
    our_crd_paths,
)
from tools.controlplane.cluster import ControlPlaneError, LocalControlPlane
from tools.controlplane.crds import install_crds
from tools.controlplane.versions import REPO_ROOT, load_versions

DEFAULT_DIR = REPO_ROOT / ".local" / "cluster"


async def _install(kubeconfig: Path, *, external: bool = False) -> list[str]:
    """Install Cluster API's CRDs and ours. On an `external` cluster (one this tool did not start) Cluster API's
    CRDs are installed only where absent and nothing is applied with force."""
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        if not external:
            return await install_crds(kube, [*capi_crd_paths(load_versions()), *our_crd_paths()])
        capi = await install_crds(kube, capi_crd_paths(load_versions()), force=False, only_missing=True)
        return capi + await install_crds(kube, our_crd_paths(), force=False)
    finally:
        await kube.close()


def up(directory: Path) -> int:
    versions = load_versions()
    print(f"versions: {versions.describe()}", file=sys.stderr)
    existing = LocalControlPlane.attach(directory)
    if existing.state is not None and not existing.running:
        print(f"the control plane recorded in {directory} is not running; starting a fresh one", file=sys.stderr)
        existing.stop()
    elif existing.state is not None and existing.kubeconfig_path.is_file():
        print(f"a control plane is already recorded in {directory}; run `down` first", file=sys.stderr)
        return 1
    started = time.monotonic()
    binaries = binaries_dir()
    built = time.monotonic()
    plane = LocalControlPlane(directory, binaries)
    plane.start(detach=True)
    ready = time.monotonic()
    crds = asyncio.run(_install(plane.kubeconfig_path))
    print(
        f"binaries {built - started:.1f} s, apiserver ready {ready - built:.1f} s, "
        f"{len(crds)} CRDs established {time.monotonic() - ready:.1f} s",
        file=sys.stderr,
    )
    (directory / "bin").unlink(missing_ok=True)
    (directory / "bin").symlink_to(binaries)
    print(f"export KUBECONFIG={plane.kubeconfig_path}")
    return 0


def down(directory: Path) -> int:
    plane = LocalControlPlane.attach(directory)
    if plane.state is None:
        print(f"no control plane recorded in {directory}", file=sys.stderr)
    plane.stop()
    return 0


def install(kubeconfig: Path, *, external: bool = False) -> int:
    crds = asyncio.run(_install(kubeconfig, external=external))
    print(f"{len(crds)} CRDs established", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.controlplane")
    parser.add_argument("command", choices=["up", "down", "install-crds", "binaries", "versions", "capi-crds"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory of the instance")
    parser.add_argument("--kubeconfig", type=Path, help="for install-crds: the cluster to install into")
    parser.add_argument(
        "--external",
        action="store_true",
        help="for install-crds: a cluster this tool did not start (Cluster API CRDs only if absent, never forced)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return up(args.dir)
        if args.command == "down":
            return down(args.dir)
        if args.command == "install-crds":
            return install(args.kubeconfig or args.dir / "kubeconfig", external=args.external)
        if args.command == "capi-crds":
            versions = load_versions()
            for version in versions.capi_compat:
                print(f"cluster-api {version} {capi_crd_paths_of(version)[0].parent}")
            print(f"cert-manager {versions.cert_manager} {cert_manager_crd_paths(versions)[0].parent}")
            return 0
        if args.command == "binaries":
            print(binaries_dir())
            return 0
        print(load_versions().describe())
        return 0
    except (AssetError, ControlPlaneError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
