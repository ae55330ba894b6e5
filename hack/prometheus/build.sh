#!/usr/bin/env bash
# Builds promtool and the Prometheus server from the pinned Prometheus Go module (PROMETHEUS_VERSION in
# hack/versions.env) into a cache outside the work tree, keyed by version, so a warm run builds nothing. Prints the
# directory that holds both executables (`promtool` and `prometheus`).
#
# PROMETHEUS_BIN_DIR, when it names a directory with executables `promtool` and `prometheus`, is used as is (they
# should be the same release).
#
# Build tags:
#   remove_all_sd  keeps only the static, file and http service discovery: promtool checks and unit-tests rules, and
#                  the server scrapes a static target for the dashboard screenshot; the cloud SDs' dependency trees
#                  would multiply the build time for nothing.
#   netgo          the pure-Go resolver, as upstream releases do.
# GOWORK=off: the module ships a go.work naming folders that its module zip lacks.
# Without `builtinassets` the server serves no web UI (the UI is a separately built JavaScript bundle); its HTTP API,
# which the tests and tools/dashboard_render.py use, is complete.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../versions.env
source "$here/../versions.env"
module=github.com/prometheus/prometheus

if [[ -n "${PROMETHEUS_BIN_DIR:-}" && -x "$PROMETHEUS_BIN_DIR/promtool" && -x "$PROMETHEUS_BIN_DIR/prometheus" ]]; then
  echo "$PROMETHEUS_BIN_DIR"
  exit 0
fi

cache="${IPAM_PROVIDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-provider}"
bin="$cache/bin/prometheus-${PROMETHEUS_VERSION}"
mkdir -p "$bin"
# Builds started at once (two checkouts, or a test and CI) take turns: the second finds the binaries built.
exec 9>"$bin/.build.lock"
flock 9

if [[ ! -x "$bin/promtool" || ! -x "$bin/prometheus" ]]; then
  command -v go >/dev/null || { echo "error: Go is needed to build promtool and prometheus (or set PROMETHEUS_BIN_DIR)" >&2; exit 1; }
  if ! json="$(cd / && go mod download -json "$module@$PROMETHEUS_VERSION" 2>&1)"; then
    echo "error: go mod download $module@$PROMETHEUS_VERSION failed: $json" >&2
    exit 1
  fi
  module_dir="$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error","no Dir")))' <<<"$json")"
  # Module v0.3MM.P is Prometheus 3.MM.P (the release's VERSION file says the same).
  release="$(cat "$module_dir/VERSION")"
  ldflags="-s -w"
  for pair in "Version=$release" "Revision=$PROMETHEUS_VERSION" Branch=HEAD BuildUser=ipam-provider \
              BuildDate=19700101-00:00:00; do
    ldflags+=" -X github.com/prometheus/common/version.$pair"
  done
  started=$SECONDS
  echo "building promtool and prometheus $release from $module@$PROMETHEUS_VERSION ..." >&2
  src="$bin/.src"
  rm -rf "$src" && cp -r "$module_dir" "$src" && chmod -R u+w "$src"
  for cmd in promtool prometheus; do
    (cd "$src" && GOWORK=off CGO_ENABLED=0 go build -trimpath -tags netgo,remove_all_sd -ldflags="$ldflags" \
      -o "$bin/$cmd.partial" "./cmd/$cmd") >&2
    mv "$bin/$cmd.partial" "$bin/$cmd"
  done
  rm -rf "$src"
  echo "built promtool and prometheus in $((SECONDS - started)) s" >&2
fi
echo "$bin"
