# Shared by hack/image/*.sh: where the image cache lives, the tools the build needs, and a timer.
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this file
IMAGE_HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$IMAGE_HACK/../.." && pwd)"
# The Debian release of the local base image. Its python3 must be the Python of the Dockerfile's default base
# (python:3.11-slim): bookworm ships 3.11.
BASE_RELEASE="${BASE_RELEASE:-bookworm}"
BASE_MIRROR="${BASE_MIRROR:-http://deb.debian.org/debian}"
# What the base has on top of debootstrap's minbase (which already has passwd: groupadd, useradd).
BASE_PACKAGES="python3,python3-venv,ca-certificates,libjemalloc2"
# Part of the base's cache key with the three above: bump it when base.sh changes what it builds.
BASE_RECIPE=1
BASE_IMAGE_NAME="localhost/ipam-provider-base"
IMAGE_CACHE="${IPAM_PROVIDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-provider}/image"

image_log() { echo "image: $*" >&2; }

image_timed() {  # image_timed <label> <command...>: runs it, then says how long it took (stderr)
  local label="$1" started="$EPOCHREALTIME"
  shift
  "$@"
  image_log "$label took $(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s"
}

# Installs the Debian packages named (by command) when their command is missing; apt-get update first.
image_need() {  # image_need <command>=<package> ...
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null || missing+=("${pair#*=}")
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -ne 0 ]]; then
    image_log "missing ${missing[*]} (Debian packages); install them as root" && return 1
  fi
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  }
  image_timed "apt-get install ${missing[*]}" apt_install "${missing[@]}"
}
