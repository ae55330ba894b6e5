"""A local control plane for development and tests: etcd and kube-apiserver built from their Go modules.

`python -m tools.controlplane up|down|env` drives it from the shell (see `make cluster-up`); the pytest plugin
`tests.support.cluster` drives it from the test suite. Versions are pinned in `hack/versions.env`.
"""
