#!/usr/bin/env bash
# Builds the Dockerfile with buildah (no Docker engine needed) into buildah's local storage.
#
#   IMAGE_BASE=debian (default)  the local Debian base from hack/image/base.sh, where no registry can be reached
#   IMAGE_BASE=pinned            the Dockerfile's default: python:3.11-slim pinned by digest (needs Docker Hub)
#   IMAGE_BASE=<image>           any other base, passed as --build-arg PYTHON_IMAGE=<image>
#   IMAGE=<name>                 the image's name (default localhost/capi-ipam-provider-py:dev)
#
# RUN steps use chroot isolation: no runc/crun is needed (they cannot set rlimits in a sandbox), and the steps share
# the build machine's network, so pip reaches PyPI. pip in the build trusts the build machine's CA bundle (a
# bind mount for the RUN steps only, never part of the image), so it also works behind a TLS-inspecting proxy.
# Layers are cached (--layers): a rebuild with unchanged sources reuses every step. Prints the image's name.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

image_need buildah=buildah
IMAGE_BASE="${IMAGE_BASE:-debian}"
IMAGE="${IMAGE:-localhost/capi-ipam-provider-py:dev}"
args=()
case "$IMAGE_BASE" in
  debian) args+=(--build-arg "PYTHON_IMAGE=$("$IMAGE_HACK/base.sh")") ;;
  pinned) ;;
  *) args+=(--build-arg "PYTHON_IMAGE=$IMAGE_BASE") ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The RUN steps get a scratch /root (root's home, which the base already has, so no mount point is left in any
# layer) holding a pip config that trusts the build machine's CA bundle.
ca="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
mkdir -p "$work/root/.config/pip"
if [[ -s "$ca" ]]; then
  cp "$ca" "$work/root/build-ca.crt"
  printf '[global]\ncert = /root/build-ca.crt\n' >"$work/root/.config/pip/pip.conf"
fi
args+=(--volume "$work/root:/root")

image_timed "buildah build of $IMAGE (IMAGE_BASE=$IMAGE_BASE)" \
  buildah build --isolation=chroot --layers --pull=false --quiet "${args[@]}" --tag "$IMAGE" \
  --file "$REPO_ROOT/Dockerfile" "$REPO_ROOT" >/dev/null
echo "$IMAGE"
