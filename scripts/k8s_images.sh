#!/usr/bin/env bash
# k8s_images.sh - the one-machine cluster's two images, built here (no registry is reachable)
# and imported into a node's containerd:
#   docker.io/monarch-nb/pause:1    containerd's sandbox image: our pause (deploy/kubernetes/components/pause)
#   docker.io/monarch-nb/worker:1   the worker image: a minimal Debian 12 root (debootstrap, from the
#                                   machine's own Debian mirror) with Python 3.11. On this cluster the
#                                   pod mounts the repository and its .venv read-only at the same path
#                                   (hostPath), so pods run the kernel's exact torch, torchmonarch and
#                                   monarch_nb; a real cluster bakes them in (deploy/kubernetes/Dockerfile)
#                                   and the same manifests serve it without the mount.
#
#   scripts/k8s_images.sh build          # build both OCI archives into the cache (once)
#   scripts/k8s_images.sh import SOCKET  # import them into the containerd at SOCKET (once per node)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${MONARCH_NB_K8S_CACHE:-$HOME/.cache/monarch_nb/k8s}/images"
RECIPE_KEY="$(cat "$0" | sha256sum | cut -c1-12)"
OUT="$CACHE/$RECIPE_KEY"
log() { printf '\033[1m[k8s images]\033[0m %s\n' "$*" >&2; }

oci_archive() {  # oci_archive NAME ROOTFS_DIR ENTRYPOINT...: an OCI image archive of a directory tree
  local name=$1 rootfs=$2; shift 2
  local work; work=$(mktemp -d "$CACHE/build.XXXXXX")
  umoci init --layout "$work/layout"
  umoci new --image "$work/layout:1"
  umoci unpack --image "$work/layout:1" "$work/bundle" >/dev/null
  cp -a "$rootfs/." "$work/bundle/rootfs/"
  umoci repack --image "$work/layout:1" "$work/bundle"
  local args=() e; for e in "$@"; do args+=(--config.entrypoint "$e"); done
  umoci config --image "$work/layout:1" "${args[@]}" --config.workingdir / \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  umoci gc --layout "$work/layout"
  tar -C "$work/layout" -cf "$OUT/$name.tar.tmp" .
  mv "$OUT/$name.tar.tmp" "$OUT/$name.tar"
  rm -rf "$work"
}

build() {
  mkdir -p "$OUT"
  if [ ! -f "$OUT/worker.tar" ]; then
    local start=$SECONDS root mirror
    root=$(mktemp -d "$CACHE/worker.XXXXXX")
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
    log "building monarch-nb/worker:1 (debootstrap bookworm + python3.11 from $mirror)"
    debootstrap --variant=minbase --include=python3.11,libgomp1 bookworm "$root/rootfs" "$mirror" >/dev/null
    rm -rf "$root/rootfs"/usr/share/{doc,man,locale,info} "$root/rootfs"/var/cache/apt/* "$root/rootfs"/var/lib/apt/lists/*
    oci_archive worker "$root/rootfs" /usr/bin/python3.11
    rm -rf "$root"
    log "built monarch-nb/worker:1 in $((SECONDS - start)) s"
  fi
  if [ ! -f "$OUT/pause.tar" ]; then
    local bin root; bin="$("$ROOT/scripts/k8s_build.sh")"
    root=$(mktemp -d "$CACHE/pause.XXXXXX")
    install -m 755 "$bin/pause" "$root/pause"
    oci_archive pause "$root" /pause
    rm -rf "$root"
    log "built monarch-nb/pause:1"
  fi
}

import() {
  local sock=$1 name have
  for name in pause worker; do
    have=$(ctr --address "$sock" -n k8s.io images ls -q 2>/dev/null | grep -c "^docker.io/monarch-nb/$name:1$" || true)
    [ "$have" -gt 0 ] && continue
    ctr --address "$sock" -n k8s.io images import --base-name "docker.io/monarch-nb/$name" "$OUT/$name.tar" >/dev/null
  done
}

case "${1:-}" in
  build) build ;;
  import) [ -f "$OUT/worker.tar" ] || build; import "${2:?containerd socket}" ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
