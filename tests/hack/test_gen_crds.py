"""The CRDs under crds/ are what `make generate` writes from the spec models, and they are the CRDs of the
reference commit REFERENCE but for descriptions, the order of keys and of lists whose order means nothing, and the
changes made on purpose since (SINCE)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import gen_crds

REPO = Path(__file__).resolve().parents[2]
REFERENCE = "73a4755"
# Lists compared as sets: their order means nothing to the API server.
UNORDERED = {"required", "enum", "categories", "x-kubernetes-validations"}
SPEC = "spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/"
NETBOX_SECRET = SPEC + "connection/properties/secretRef/properties/"
# Schema changes since REFERENCE, by CRD file: the keyword paths (under SPEC) that may differ. 95236a8 checks the
# Secret's name and namespace of a NetBox pool as object names; 750caff does so for Infoblox and adds
# allowedNamespaces.
SINCE = {
    "ipam.cluster.x-k8s.io_netboxippools.yaml": [NETBOX_SECRET + "name/pattern"],
    "ipam.cluster.x-k8s.io_globalnetboxippools.yaml": [
        NETBOX_SECRET + "name/pattern",
        NETBOX_SECRET + "namespace/pattern",
    ],
    "ipam.cluster.x-k8s.io_infobloxinstances.yaml": [
        SPEC + "allowedNamespaces",
        *(
            SPEC + f"{ref}/properties/{key}/{word}"
            for ref in ("credentialsSecretRef", "caBundleSecretRef")
            for key in ("name", "namespace")
            for word in ("minLength", "pattern")
        ),
    ],
    "ipam.cluster.x-k8s.io_infobloxippools.yaml": [
        SPEC + "instanceRef/properties/name/minLength",
        SPEC + "instanceRef/properties/name/pattern",
    ],
}


def normalized(node: Any, key: str = "") -> Any:
    """`node` without description keywords, its unordered lists sorted (a `properties` map keeps every key: a
    field may be named description)."""
    if isinstance(node, dict):
        fields = key == "properties"
        return {k: normalized(v, k) for k, v in node.items() if fields or k != "description"}
    if isinstance(node, list):
        items = [normalized(item) for item in node]
        return sorted(items, key=repr) if key in UNORDERED else items
    return node


def without(document: Any, paths: list[str]) -> Any:
    """`document` with the keyword at each slash-separated path (list indexes as numbers) removed, if present."""
    for path in paths:
        *parents, last = path.split("/")
        node = document
        for step in parents:
            node = node[int(step)] if isinstance(node, list) else node.get(step, {})
        node.pop(last, None)
    return document


def reference_files() -> list[str]:
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{REFERENCE}:crds"], cwd=REPO, capture_output=True, text=True
    )
    if listing.returncode != 0:
        pytest.fail(f"the reference commit {REFERENCE} is not in this clone: {listing.stderr}", pytrace=False)
    return [name for name in listing.stdout.split() if name.endswith(".yaml")]


def reference(name: str) -> Any:
    shown = subprocess.run(["git", "show", f"{REFERENCE}:crds/{name}"], cwd=REPO, capture_output=True, check=True)
    return yaml.safe_load(shown.stdout)


@pytest.mark.parametrize("name", reference_files())
def test_a_crd_differs_from_the_reference_only_in_descriptions_and_order(name: str) -> None:
    generated = yaml.safe_load((REPO / "crds" / name).read_text())
    since = SINCE.get(name, [])
    assert without(normalized(generated), since) == without(normalized(reference(name)), since)


def test_the_committed_crds_are_what_make_generate_writes(tmp_path: Path) -> None:
    gen_crds.write(tmp_path)
    generated = {path.name: path.read_text() for path in tmp_path.iterdir()}
    committed = {path.name: path.read_text() for path in (REPO / "crds").iterdir()}
    assert generated == committed, "crds/ is out of date: run `make generate`"


def test_crds_holds_the_reference_crds() -> None:
    assert sorted(path.name for path in (REPO / "crds").glob("*.yaml")) == sorted(reference_files())
