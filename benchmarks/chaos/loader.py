"""Backends by name, imported lazily, and the resources their manifests need.

A backend `<name>` lives in module `benchmarks.chaos.<name>`, which provides either a factory function
`create_chaos_backend(...)` or a class whose `name` attribute is `<name>`. The factory (or class) is called with
the keyword arguments it declares among:
- `kubeconfig`: the admin kubeconfig of the run's control plane (`Path`),
- `workdir`: a directory of the run's own, removed afterwards unless logs are kept (`Path`),
- `seed`: the run's seed (`int`),
- `namespace`: the namespace the run's claims live in (`str`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from benchmarks.chaos.backends import ChaosBackend
from ipam_provider.runtime.kube.resources import Resource
from tools.controlplane.crds import load_documents

BACKENDS = ("incluster", "netbox", "infoblox")
CORE = {
    "Secret": Resource("", "v1", "secrets", "Secret", namespaced=True),
    "ConfigMap": Resource("", "v1", "configmaps", "ConfigMap", namespaced=True),
}


def module_name(name: str) -> str:
    return f"benchmarks.chaos.{name}"


def available() -> list[str]:
    """The backends whose module is present in this checkout."""
    return [name for name in BACKENDS if importlib.util.find_spec(module_name(name)) is not None]


def load(name: str, **context: Any) -> ChaosBackend:
    """The backend `name`, made with the arguments of `context` that its factory declares."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
    module = importlib.import_module(module_name(name))
    factory = getattr(module, "create_chaos_backend", None)
    if factory is None:
        classes = [
            value
            for value in vars(module).values()
            if inspect.isclass(value) and value.__module__ == module.__name__ and getattr(value, "name", None) == name
        ]
        if len(classes) != 1:
            raise ValueError(f"{module.__name__} has no create_chaos_backend() and no single class named {name!r}")
        factory = classes[0]
    parameters = inspect.signature(factory).parameters
    return cast(ChaosBackend, factory(**{key: value for key, value in context.items() if key in parameters}))


def resources_of(crd_paths: Iterable[Path]) -> dict[tuple[str, str], Resource]:
    """(apiVersion, kind) → the REST resource, for every version of the CRDs in `crd_paths` and the core kinds
    manifests use (Secret, ConfigMap)."""
    found = {("v1", kind): resource for kind, resource in CORE.items()}
    for crd in load_documents(crd_paths):
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for version in spec.get("versions") or []:
            resource = Resource(
                spec["group"],
                version["name"],
                spec["names"]["plural"],
                spec["names"]["kind"],
                namespaced=spec.get("scope") == "Namespaced",
            )
            found[(resource.api_version, resource.kind)] = resource
    return found
