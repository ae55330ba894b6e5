#!/usr/bin/env bash
# Builds one executable of the pinned Cluster API Go module (CAPI_VERSION in hack/versions.env) into a cache outside
# the work tree, keyed by version, so a warm run builds nothing. Prints the path of the binary.
#
# Usage: hack/clusterctl/build.sh [clusterctl|core-manager]
#   clusterctl    (the default) ./cmd/clusterctl; CLUSTERCTL, when it names an executable, is used as is (it should
#                 be the same release).
#   core-manager  the core manager (the Cluster, Machine, topology and Runtime SDK controllers): the module's root
#                 package main up to v1.13, ./core from v1.14. CAPI_CORE_MANAGER, when it names an executable, is
#                 used as is.
#
# Not `go install sigs.k8s.io/cluster-api/cmd/clusterctl@$CAPI_VERSION`: that also asks the module proxy for the
# module's version list, which the proxy here refuses. Both packages belong to the root module, so a writable copy of
# the module from the module cache, with its own go.mod and go.sum, builds them with the same build list.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../versions.env
source "$here/../versions.env"
module=sigs.k8s.io/cluster-api
target="${1:-clusterctl}"
case "$target" in
  clusterctl) name=clusterctl override_var=CLUSTERCTL ;;
  core-manager) name=capi-core-manager override_var=CAPI_CORE_MANAGER ;;
  *) echo "usage: $0 [clusterctl|core-manager]" >&2; exit 2 ;;
esac
override="${!override_var:-}"

if [[ -n "$override" && -x "$override" ]]; then
  echo "$override"
  exit 0
fi

cache="${IPAM_PROVIDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-provider}"
bin="$cache/bin/$name-${CAPI_VERSION}"
mkdir -p "$bin"
# Builds started at once (two checkouts, or a test and CI) take turns: the second finds the binary built.
exec 9>"$bin/.build.lock"
flock 9

if [[ ! -x "$bin/$name" ]]; then
  command -v go >/dev/null || { echo "error: Go is needed to build $name (or set $override_var)" >&2; exit 1; }
  if ! json="$(cd / && go mod download -json "$module@$CAPI_VERSION" 2>&1)"; then
    echo "error: go mod download $module@$CAPI_VERSION failed: $json" >&2
    exit 1
  fi
  module_dir="$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error","no Dir")))' <<<"$json")"
  package=./cmd/clusterctl
  if [[ "$target" == core-manager ]]; then
    package=.
    [[ -f "$module_dir/core/main.go" ]] && package=./core
  fi
  minor="${CAPI_VERSION#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for pair in "gitVersion=$CAPI_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean \
              buildDate=1970-01-01T00:00:00Z; do
    ldflags+=" -X sigs.k8s.io/cluster-api/version.$pair"
  done
  started=$SECONDS
  echo "building $name from $module@$CAPI_VERSION ($package) ..." >&2
  src="$bin/.src"
  rm -rf "$src" && cp -r "$module_dir" "$src" && chmod -R u+w "$src"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$bin/$name.partial" "$package") >&2
  mv "$bin/$name.partial" "$bin/$name"
  rm -rf "$src"
  echo "built $name in $((SECONDS - started)) s" >&2
fi
echo "$bin/$name"
