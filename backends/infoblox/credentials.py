"""From an InfobloxInstance and its Secrets to what a connection to its grid needs.

Contract:
- `read_material(kube, instance)` validates the instance's spec, reads its credentials Secret (`username` and
  `password`, or `clientCert`/`tls.crt` and `clientKey`/`tls.key`) and its CA bundle (`caBundle`, or the key of
  `caBundleSecretRef`), and answers the Connector options with a key that changes when the instance's generation
  or either Secret's resourceVersion does.
- Problems that need a person (spec invalid, Secret missing or incomplete, CA bundle unreadable) raise
  `InstanceProblem` with a condition reason and a message.
- Credentials are only ever put in the Connector options (and, for a client certificate or a CA bundle, in 0600
  files of a private 0700 temporary directory, removed with the connection, or at once if reading fails). They
  never reach a log, a condition or an exception.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from backends.infoblox.spec import InstanceSpec
from backends.validation import spec_error
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS


class InstanceProblem(Exception):
    """An InfobloxInstance that cannot be used; `reason` and `message` go into conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Material:
    """What a connection to one instance is built from."""

    key: tuple[str, ...]  # instance uid and generation, Secret resourceVersions: a change means a new connection
    spec: InstanceSpec
    options: dict[str, Any]  # the Connector's
    secret: str  # "<namespace>/<name>" of the credentials Secret, for messages
    files: tempfile.TemporaryDirectory[str] | None  # the private files the options name


async def read_material(kube: KubeClient, instance: Object) -> Material:
    """What a connection to `instance` needs; private files are removed again if reading fails."""
    try:
        spec = InstanceSpec.model_validate(instance.get("spec") or {})
    except ValidationError as error:
        raise InstanceProblem("InvalidConfiguration", spec_error(error)) from error
    ref = spec.credentials_secret_ref
    secret_label = f"{ref.namespace}/{ref.name}"
    secret = await kube.get(SECRETS, ref.name, ref.namespace)
    if secret is None:
        raise InstanceProblem(
            "CredentialsNotFound", f"Secret {secret_label} (spec.credentialsSecretRef) was not found; create it"
        )
    data = _decode(secret)
    pem, ca_version = (None, "") if spec.insecure_skip_verify else await _ca_bundle(kube, spec)
    if pem is not None:
        try:
            ssl.create_default_context(cadata=pem)
        except (ssl.SSLError, ValueError) as error:
            raise InstanceProblem("InvalidCABundle", "the CA bundle holds no readable PEM certificate") from error
    options: dict[str, Any] = {"host": spec.netloc, "wapi_version": spec.wapi_version}
    cert = data.get("clientCert") or data.get("tls.crt")
    key = data.get("clientKey") or data.get("tls.key")
    use_password = bool(data.get("username") and data.get("password"))
    if not use_password and not (cert and key):
        raise InstanceProblem(
            "InvalidCredentials",
            f"Secret {secret_label} (spec.credentialsSecretRef) holds neither username and password nor clientCert "
            "and clientKey",
        )
    files = None
    if pem is not None or not use_password:
        files = tempfile.TemporaryDirectory(prefix="ipam-infoblox-")  # 0700, removed with the connection
    if use_password:
        options["username"] = data["username"].decode("utf-8", "replace")
        options["password"] = data["password"].decode("utf-8", "replace")
    elif files is not None and cert and key:
        options["cert"] = _private_file(files.name, "client.crt", cert)
        options["key"] = _private_file(files.name, "client.key", key)
    if spec.insecure_skip_verify:
        options["ssl_verify"] = False
    elif pem is None:
        options["ssl_verify"] = True  # the CAs requests trusts (certifi, or REQUESTS_CA_BUNDLE)
    elif files is not None:
        options["ssl_verify"] = _private_file(files.name, "ca.crt", pem.encode())
    meta = instance["metadata"]
    key_parts = (str(meta.get("uid")), str(meta.get("generation")), str(secret["metadata"]["resourceVersion"]))
    return Material((*key_parts, ca_version), spec, options, secret_label, files)


async def _ca_bundle(kube: KubeClient, spec: InstanceSpec) -> tuple[str | None, str]:
    """The instance's CA bundle (None: the default trust store) and the resourceVersion of its Secret, if any."""
    if spec.ca_bundle:
        return spec.ca_bundle, ""
    ref = spec.ca_bundle_secret_ref
    if ref is None:
        return None, ""
    secret = await kube.get(SECRETS, ref.name, ref.namespace)
    if secret is None:
        raise InstanceProblem("InvalidCABundle", f"CA bundle Secret {ref.namespace}/{ref.name} was not found")
    value = _decode(secret).get(ref.key)
    if not value:
        raise InstanceProblem("InvalidCABundle", f"CA bundle Secret {ref.namespace}/{ref.name} has no key {ref.key!r}")
    return value.decode("utf-8", "replace"), str(secret["metadata"]["resourceVersion"])


def _decode(secret: Mapping[str, Any]) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        with contextlib.suppress(binascii.Error, ValueError, TypeError):
            decoded[key] = base64.b64decode(value)
    return decoded


def _private_file(directory: str, name: str, content: bytes) -> str:
    path = os.path.join(directory, name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
    return path
