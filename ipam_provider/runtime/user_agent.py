"""How the controller names itself to the servers it talks to.

`user_agent()` is the User-Agent of every HTTP request: the API server's and the backends'
(`capi-ipam-provider-py/0.2.0 (linux/amd64) kubernetes-asyncio/36.1.0`). `FIELD_MANAGER` is the field manager of
every write to the API server, so that an object's managedFields name the controller.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from ipam_provider.version import __version__

PRODUCT = "capi-ipam-provider-py"
FIELD_MANAGER = PRODUCT

# Machine names as Go spells GOARCH, so that the platform reads as client-go's does.
_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "i686": "386", "i386": "386"}


def user_agent(library: str | None = None) -> str:
    """`capi-ipam-provider-py/<version> (<os>/<arch>)`, then `<library>/<its version>` when `library` (an installed
    distribution's name) is given."""
    machine = platform.machine().lower()
    text = f"{PRODUCT}/{__version__} ({sys.platform}/{_GO_ARCH.get(machine, machine or 'unknown')})"
    if library is None:
        return text
    try:
        return f"{text} {library}/{metadata.version(library)}"
    except metadata.PackageNotFoundError:
        return f"{text} {library}"
