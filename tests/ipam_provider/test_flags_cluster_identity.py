"""`--cluster-identity`: blank by default (the kube-system Namespace's uid is read at start), taken as given."""

from __future__ import annotations

from ipam_provider.flags import RunOptions, parse_args


def identity(*argv: str) -> str:
    options: RunOptions = parse_args(["run", *argv]).options
    return options.cluster_identity


def test_the_identity_is_read_at_start_unless_given() -> None:
    assert identity() == ""
    assert identity("--cluster-identity=mgmt-eu-1") == "mgmt-eu-1"
    assert identity("--cluster-identity", " mgmt-eu-2 ") == "mgmt-eu-2"
