#!/usr/bin/env bash
# k8s_build.sh - build the one-machine cluster's Kubernetes binaries from Kubernetes' own Go
# modules (deploy/kubernetes/components/go.mod: k8s.io/kubernetes v1.36.3, every staging module at
# v0.36.3, etcd's server at the version that release requires) into a cache outside the repo,
# keyed by release and go.sum, so a second `up` only checks a stamp.
#
#   scripts/k8s_build.sh          # build if the cache lacks this release; print the bin dir
#
# Environment: MONARCH_NB_K8S_CACHE (default ~/.cache/monarch_nb/k8s). The first build's wall
# time goes to <cache>/<key>/build.json (and stderr): it is set-up time, reported apart.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MOD="$ROOT/deploy/kubernetes/components"
RELEASE="$(grep -oE 'k8s.io/kubernetes v1\.[0-9]+\.[0-9]+' "$MOD/go.mod" | head -1 | cut -d' ' -f2)"
KEY="$RELEASE-$(cat "$MOD/go.mod" "$MOD/go.sum" "$MOD/etcd/main.go" "$MOD/pause/main.go" | sha256sum | cut -c1-12)"
CACHE="${MONARCH_NB_K8S_CACHE:-$HOME/.cache/monarch_nb/k8s}/$KEY"
BIN="$CACHE/bin"
TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

log() { printf '\033[1m[k8s build]\033[0m %s\n' "$*" >&2; }

if [ -f "$CACHE/done" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9  # one build at a time; a second caller waits and then finds it done
if [ -f "$CACHE/done" ]; then echo "$BIN"; exit 0; fi
command -v go >/dev/null || { log "Go is required to build Kubernetes (apt-get install golang, or Go >= 1.26)"; exit 1; }
mkdir -p "$BIN"
minor="${RELEASE#v1.}"; minor="${minor%%.*}"
# What Kubernetes' own build (hack/lib/version.sh) stamps: nodes and `kubectl version` report it.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$RELEASE -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
start=$(date +%s)
log "building Kubernetes $RELEASE and etcd into $BIN (first time: tens of minutes on 2 cores)"
cd "$MOD"
pkgs=(./etcd ./pause)
for t in "${TOOLS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$t"); done
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${pkgs[@]}"
secs=$(( $(date +%s) - start ))
printf '{"release": "%s", "seconds": %s, "cores": %s, "go": "%s", "binaries": "%s"}\n' "$RELEASE" "$secs" \
  "$(nproc)" "$(go env GOVERSION)" "$(ls "$BIN" | tr '\n' ' ' | sed 's/ $//')" > "$CACHE/build.json"
touch "$CACHE/done"
log "built in ${secs} s: $(ls "$BIN" | tr '\n' ' ')"
echo "$BIN"
