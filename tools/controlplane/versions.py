"""The pinned versions of external components, read from `hack/versions.env`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    capi: str
    netbox: str
    cert_manager: str
    capi_compat: tuple[str, ...] = ()  # the compatibility matrix (tests/system/test_capi_releases.py)

    def describe(self) -> str:
        return (
            f"kube-apiserver/kubectl {self.kubernetes}, etcd {self.etcd}, "
            f"Cluster API CRDs {self.capi}, NetBox {self.netbox}, cert-manager CRDs {self.cert_manager}"
        )


def load_versions(path: Path = VERSIONS_FILE) -> Versions:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return Versions(
        kubernetes=values["KUBERNETES_VERSION"],
        etcd=values["ETCD_VERSION"],
        capi=values["CAPI_VERSION"],
        netbox=values["NETBOX_VERSION"],
        cert_manager=values["CERT_MANAGER_VERSION"],
        capi_compat=tuple(values.get("CAPI_COMPAT_VERSIONS", "").strip('"').split()),
    )
