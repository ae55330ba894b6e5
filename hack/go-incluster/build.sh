#!/usr/bin/env bash
# Builds the Go in-cluster IPAM provider (the measured baseline of benchmarks/incluster_throughput.py) from its Go
# module and fetches the CRDs it needs, all into caches outside the work tree. Nothing of it enters this repository.
#
# Pins (kept here, not in hack/versions.env, because only the benchmark uses them):
#   GO_INCLUSTER_VERSION  the provider release (v1.1.0 speaks IPAM v1beta2; v1.0.3, still selectable, v1beta1);
#   GO_INCLUSTER_CAPI     the Cluster API release whose CRDs it runs against (v1.11.7 for v1.1.0, which needs
#                         v1.11 or later; v1.10.10 for v1.0.3: v1beta1 served and stored).
# Each provider version is built and cached on its own.
# A warm run builds nothing. Prints KEY=VALUE lines: VERSION, BIN (the binary), POOL_CRDS and CAPI_CRDS (directories).
set -euo pipefail
GO_INCLUSTER_VERSION="${GO_INCLUSTER_VERSION:-v1.1.0}"
GO_INCLUSTER_CAPI="${GO_INCLUSTER_CAPI:-v1.11.7}"
module=sigs.k8s.io/cluster-api-ipam-provider-in-cluster

command -v go >/dev/null || { echo "error: Go is needed to build the Go in-cluster provider" >&2; exit 1; }
cache="${IPAM_PROVIDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-provider}"
bin="$cache/bin/go-incluster-${GO_INCLUSTER_VERSION}"

module_dir() {  # module_dir <module@version>: download into the module cache, print its directory
  local json
  if ! json="$(cd / && go mod download -json "$1" 2>&1)"; then
    echo "error: go mod download $1 failed: $json" >&2
    return 1
  fi
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error","no Dir")))' <<<"$json"
}

provider_dir="$(module_dir "$module@$GO_INCLUSTER_VERSION")"
if [[ ! -x "$bin/cluster-api-ipam-provider-in-cluster" ]]; then
  # Not `go install $module@$version`: that also asks the proxy for the module's version list (deprecation check),
  # which the proxy here refuses (403). Building a writable copy of the module with its own go.mod and go.sum
  # yields the same build list.
  started=$SECONDS
  echo "building $module@$GO_INCLUSTER_VERSION ..." >&2
  mkdir -p "$bin"
  src="$bin/.src"
  rm -rf "$src" && cp -r "$provider_dir" "$src" && chmod -R u+w "$src"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin/cluster-api-ipam-provider-in-cluster.partial" .) >&2
  mv "$bin/cluster-api-ipam-provider-in-cluster.partial" "$bin/cluster-api-ipam-provider-in-cluster"
  rm -rf "$src"
  echo "built $module@$GO_INCLUSTER_VERSION in $((SECONDS - started)) s" >&2
fi

capi_dir="$(module_dir "sigs.k8s.io/cluster-api@$GO_INCLUSTER_CAPI")"
echo "VERSION=$GO_INCLUSTER_VERSION"
echo "BIN=$bin/cluster-api-ipam-provider-in-cluster"
echo "POOL_CRDS=$provider_dir/config/crd/bases"
echo "CAPI_CRDS=$capi_dir/config/crd/bases"
