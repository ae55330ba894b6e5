#!/usr/bin/env bash
# Builds one infrastructure provider's harness: the wrapper Go module hack/providers/<name>/ (our own main package,
# whose go.mod requires the provider's module at a pinned version with the provider's own `replace` directives).
# The binary is cached outside the work tree, keyed by the provider's version and a hash of the wrapper's files, so a
# warm run builds nothing. Usage: hack/providers/build.sh <name>; prints KEY=VALUE lines: BIN (the binary) and
# MODULE_DIR (the provider module's source in the Go module cache, for its CRDs).
# A missing module or a failed build exits non-zero with Go's own message.
set -euo pipefail
name="${1:?usage: hack/providers/build.sh <name> (a folder of hack/providers)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wrapper="$here/$name"
[[ -f "$wrapper/go.mod" ]] || { echo "error: no wrapper module at $wrapper" >&2; exit 1; }
command -v go >/dev/null || { echo "error: Go is needed to build the $name harness" >&2; exit 1; }
# The provider's pinned version: the first `require` line naming `// provider` in the wrapper's go.mod.
read -r module version < <(awk '/\/\/ provider$/ {if ($1 == "require") print $2, $3; else print $1, $2; exit}' "$wrapper/go.mod") || true
[[ -n "${version:-}" ]] || { echo "error: $wrapper/go.mod names no '// provider' requirement" >&2; exit 1; }
digest="$(cat "$wrapper"/go.mod "$wrapper"/go.sum "$wrapper"/*.go | sha256sum | cut -c1-12)"
cache="${IPAM_PROVIDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-provider}"
bin="$cache/bin/harness-$name-$version-$digest/$name-harness"
mkdir -p "$(dirname "$bin")"
exec 9>"$(dirname "$bin")/.build.lock"
flock 9  # builds started at once take turns: the second finds the binary built
if [[ ! -x "$bin" ]]; then
  started=$SECONDS
  echo "building the $name harness ($version) ..." >&2
  # -mod=readonly: the committed go.sum is the whole build list; a module the proxy refuses fails here with Go's
  # reason, and nothing in the work tree is rewritten.
  (cd "$wrapper" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$bin.partial" .) >&2
  mv "$bin.partial" "$bin"
  echo "built the $name harness in $((SECONDS - started)) s" >&2
fi
json="$(cd / && go mod download -json "$module@$version")" || { echo "error: go mod download $module@$version: $json" >&2; exit 1; }
echo "BIN=$bin"
echo "MODULE_DIR=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$json")"
