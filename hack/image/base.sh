#!/usr/bin/env bash
# Builds the local base image the image build uses where no registry can be reached: a minimal Debian
# ($BASE_RELEASE, default bookworm) root filesystem from debootstrap with python3 and python3-venv, imported into
# buildah's storage as localhost/ipam-provider-base:$BASE_RELEASE (`buildah from scratch` + `buildah add` +
# `buildah commit`). It stands in for python:3.11-slim: same Debian, same Python minor version, groupadd/useradd.
#
# Two caches, outside the work tree, both keyed by release, mirror, package list and recipe version (lib.sh):
# the debootstrap root filesystem as a tarball under ~/.cache/ipam-provider/image/ (the slow step), and the
# imported image (annotated with the key). A warm run finds the image and returns at once. Prints its name.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

image_need buildah=buildah
key="$(printf '%s\n' "$BASE_RELEASE" "$BASE_MIRROR" "$BASE_PACKAGES" "$BASE_RECIPE" | sha256sum | cut -c1-16)"
image="$BASE_IMAGE_NAME:$BASE_RELEASE"
cache="$IMAGE_CACHE/$BASE_RELEASE-$key"
mkdir -p "$cache"
# One build at a time per cache (two test sessions, or a test and `make docker-build`).
exec {lock}>"$cache/.lock"
flock "$lock"

if [[ "$(buildah inspect --type image --format '{{index .ImageAnnotations "org.ipam-provider.base.key"}}' \
  "$image" 2>/dev/null)" == "$key" ]]; then
  echo "$image"
  exit 0
fi

rootfs_tar="$cache/rootfs.tar"
if [[ ! -s "$rootfs_tar" ]]; then
  image_need debootstrap=debootstrap
  bootstrap() {
    local work
    work="$(mktemp -d "$cache/rootfs.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$BASE_RELEASE" "$work/root" "$BASE_MIRROR" \
      >"$work/debootstrap.log" 2>&1; then
      tail -n 30 "$work/debootstrap.log" >&2
      [[ -f "$work/root/debootstrap/debootstrap.log" ]] && tail -n 30 "$work/root/debootstrap/debootstrap.log" >&2
      image_log "debootstrap $BASE_RELEASE failed"
      return 1
    fi
    # What an image does not need: downloaded packages, package lists, docs.
    rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/* \
      "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/* "$work/root"/usr/share/info/*
    tar --numeric-owner --xattrs -C "$work/root" -cf "$work/rootfs.tar" .
    mv "$work/rootfs.tar" "$rootfs_tar"
    # Root filesystems of this release under an older key (another mirror, package list or recipe) are stale.
    find "$IMAGE_CACHE" -mindepth 1 -maxdepth 1 -name "$BASE_RELEASE-*" ! -path "$cache" -exec rm -rf {} +
  }
  image_timed "debootstrap $BASE_RELEASE with $BASE_PACKAGES" bootstrap
fi

import() {
  local container
  container="$(buildah from --quiet scratch)"
  # shellcheck disable=SC2064
  trap "buildah rm '$container' >/dev/null 2>&1 || true" RETURN
  buildah add --quiet "$container" "$rootfs_tar" / >/dev/null
  # The settings of the official python images that the Dockerfile relies on.
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --annotation "org.ipam-provider.base.key=$key" \
    --label "org.opencontainers.image.description=Debian $BASE_RELEASE minbase with python3 (debootstrap)" \
    "$container"
  buildah commit --quiet --rm "$container" "$image" >/dev/null
}
image_timed "import of the $BASE_RELEASE root filesystem as $image" import
echo "$image"
