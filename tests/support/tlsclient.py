"""A TLS client limited to a version or to cipher suites, to see what a server negotiates or refuses."""

from __future__ import annotations

import socket
import ssl

import pytest


def handshake(port: int, maximum: ssl.TLSVersion | None = None, ciphers: str | None = None) -> tuple[str, str]:
    """(TLS version, cipher) a client limited to `maximum` and offering `ciphers` negotiates with 127.0.0.1:port.
    Raises ssl.SSLError (or ConnectionResetError) when the server refuses it."""
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    if maximum is not None:
        client.maximum_version = maximum
    if ciphers is not None:
        client.set_ciphers(ciphers)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, client.wrap_socket(raw) as tls:
        version, cipher = tls.version(), tls.cipher()
    assert version is not None and cipher is not None
    return version, cipher[0]


def refused(port: int, maximum: ssl.TLSVersion | None = None, ciphers: str | None = None) -> None:
    """The handshake fails. asyncio's TLS server drops the connection without sending the alert, so the client
    sees the connection end (or be reset); the tests show the cause with a server that takes the same client."""
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        handshake(port, maximum, ciphers)
