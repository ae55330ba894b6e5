"""Access to the API server. Importing this package makes kubernetes-asyncio's packages lean first (see
`_import_kubernetes_asyncio_lean`)."""

from __future__ import annotations

import importlib.util
import sys
import types


def _import_kubernetes_asyncio_lean() -> None:
    """Make `kubernetes_asyncio`, `.client` and `.client.models` bare packages over the installed files, unless they
    are imported already. Their `__init__` modules import every generated API class and model (33 MiB of a
    process's memory); `kube.client` uses `Configuration`, `ApiClient`'s HTTP session and the kubeconfig loaders,
    none of which needs a model."""
    if "kubernetes_asyncio" in sys.modules:
        return
    spec = importlib.util.find_spec("kubernetes_asyncio")
    if spec is None or not spec.submodule_search_locations:
        return  # the import below then fails with Python's own message
    root = spec.submodule_search_locations[0]
    bare: dict[str, types.ModuleType] = {}
    for name, folder in (("", ""), (".client", "/client"), (".client.models", "/client/models")):
        bare[name] = types.ModuleType("kubernetes_asyncio" + name)
        bare[name].__path__ = [root + folder]
        sys.modules["kubernetes_asyncio" + name] = bare[name]
    from kubernetes_asyncio.client.api_client import ApiClient
    from kubernetes_asyncio.client.configuration import Configuration

    bare[".client"].ApiClient, bare[".client"].Configuration = ApiClient, Configuration  # type: ignore[attr-defined]
    bare[""].client = bare[".client"]  # type: ignore[attr-defined]


_import_kubernetes_asyncio_lean()
