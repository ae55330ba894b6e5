"""`ipam_provider/runtime/` knows no IPAM kind, group, backend or projection: not in its code, not in its comments.

Every line of every file under the package is searched for the API groups of Cluster API and of this provider and for
the domain's words. `x509.IPAddress` (cryptography's subject-alternative-name type) and the standard library's
`ipaddress` module are not ours and are allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

import ipam_provider.runtime

RUNTIME = Path(ipam_provider.runtime.__file__).parent

GROUP = re.compile(r"cluster\.x-k8s\.io")
"""The API groups `cluster.x-k8s.io` and `ipam.cluster.x-k8s.io`, in any spelling of a kind's group."""

CASED_WORDS = re.compile(r"\bIPAM\b|IPAddress(?:es|Claims?)?\b|\b(?:Global)?InClusterIPPools?\b|\bIPPools?\b")
"""Kinds, as written: case matters, so that the standard library's `ipaddress` module does not count."""

WORDS = re.compile(r"\b(?:ipaddressclaims?|ipaddresses|claims?|pools?|netbox|infoblox)\b", re.I)
"""Domain words in any case, as whole words: `ThreadPoolExecutor`, `pool_manager` and `pynetbox` are not words."""

ALLOWED = re.compile(r"\bx509\.IPAddress\b")
"""cryptography's `x509.IPAddress`: removed from a line before it is searched."""


def domain_words(line: str) -> list[str]:
    """The domain words of `line`, each once, in the order of the patterns."""
    line = ALLOWED.sub("", line)
    found = [match.group(0) for pattern in (GROUP, CASED_WORDS, WORDS) for match in pattern.finditer(line)]
    return list(dict.fromkeys(found))


def test_no_file_under_runtime_names_the_domain() -> None:
    found = [
        f"{path.relative_to(RUNTIME.parent.parent)}:{number}: {', '.join(words)}"
        for path in sorted(RUNTIME.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (words := domain_words(line))
    ]
    assert not found, "the runtime names the IPAM domain:\n" + "\n".join(found)


def test_the_search_finds_each_kind_of_word_and_spares_what_is_not_ours() -> None:
    assert domain_words('GROUP = "ipam.cluster.x-k8s.io"') == ["cluster.x-k8s.io"]
    assert domain_words("# IPAM: IPAddressClaim and InClusterIPPool") == ["IPAM", "IPAddressClaim", "InClusterIPPool"]
    assert domain_words("a claim's pool, on NetBox or Infoblox") == ["claim", "pool", "NetBox", "Infoblox"]
    assert domain_words("x509.IPAddress(IPv4Address('127.0.0.1'))") == []
    assert domain_words("from ipaddress import IPv4Address") == []
    assert domain_words("ThreadPoolExecutor(1); rest.pool_manager; connection_pool_maxsize; pynetbox") == []
