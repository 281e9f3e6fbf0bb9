#!/usr/bin/env bash
# One entry point for people and CI. Every command first makes the environment complete
# (idempotent: a second run only checks stamps), then does its job.
#
#   ./run.sh lab     set up, then start JupyterLab on 127.0.0.1 with notebooks/ and the Monarch kernel
#   ./run.sh demo    set up, then run the fault-tolerant training notebook headless (writes runs/ and an output notebook)
#   ./run.sh test    set up, start the local SLURM and Kubernetes clusters, run the whole test suite, stop them
#   ./run.sh test --quick   the inner loop: no slow, SLURM or browser tests (< 3 min; no cluster, no chromium)
#   ./run.sh slurm up|down|status   a real one-machine SLURM cluster (2 virtual nodes) for notebooks/05
#                    (`up --netns [--link-rate 2gbit]`: each node in its own network namespace)
#   ./run.sh k8s up|down|status     a real one-machine Kubernetes cluster (2 nodes), built from
#                    Kubernetes' Go modules on first use (cached), context "monarch-nb" in ~/.kube/config
#   ./run.sh setup   only set up
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

log() { printf '\033[1m[monarch_nb]\033[0m %s\n' "$*" >&2; }

need_python() {
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$cand"; return
    fi
  done
  log "Python 3.11 is required (torchmonarch 0.7.0 ships cp311 wheels only)"; exit 1
}

setup_python() {
  if [ ! -x "$PY" ]; then
    log "creating $VENV"
    "$(need_python)" -m venv "$VENV"
  fi
  local stamp="$VENV/.monarch_nb-deps"
  local want
  want="$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing pinned dependencies (first time: a few minutes)"
    "$PY" -m pip install -q -r requirements.txt -c constraints.txt
    "$PY" -m pip install -q --no-deps -e .
    echo "$want" > "$stamp"
  fi
  "$PY" -m monarch_nb.cli install-kernel >/dev/null
}

setup_names() {
  # torch's TCPStore client looks up the name of the address it connected to (IPv4 as
  # ::ffff:a.b.c.d); /etc/hosts has no IPv6-mapped line for loopback, so every connect asks
  # DNS, and a lost reply costs glibc's 5 s timeout. Each quorum change connects once per group:
  # at 16 groups a lost reply in one of them held every survivor for 5 s (RESULTS.md, the
  # recovery ladder). One mapped line answers the lookup from the file.
  # (its own name: naming it "localhost" would make "localhost" resolve to the mapped form too,
  # and servers bound to 127.0.0.1 then refused clients that picked it)
  local line="::ffff:127.0.0.1 localhost-v4mapped # monarch_nb: torch's reverse lookups"
  grep -qE '^::ffff:127\.0\.0\.1[[:space:]]+localhost-v4mapped' /etc/hosts 2>/dev/null && return 0
  if [ -w /etc/hosts ] && grep -qE '^::ffff:127\.0\.0\.1[[:space:]]' /etc/hosts; then  # an older line of ours
    sed -i '/^::ffff:127\.0\.0\.1[[:space:]].*monarch_nb/d' /etc/hosts
  fi
  if [ -w /etc/hosts ]; then
    printf '%s\n' "$line" >> /etc/hosts
  else
    log "note: add '::ffff:127.0.0.1 localhost-v4mapped' to /etc/hosts (a quorum change otherwise waits on DNS)"
  fi
}

setup_browser() {
  # The real-browser test drives Debian's Chromium through Playwright (never `playwright install`).
  if [ ! -x /usr/bin/chromium ]; then
    log "installing Debian chromium for the browser test"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
  fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  setup)
    setup_python; setup_names; setup_browser ;;
  lab)
    setup_python; setup_names
    log "JupyterLab on http://127.0.0.1:${PORT:-8888} (kernel: Monarch)"
    exec "$VENV/bin/jupyter" lab --ip=127.0.0.1 --port="${PORT:-8888}" --no-browser \
      --ServerApp.root_dir="$ROOT/notebooks" --MultiKernelManager.default_kernel_name=monarch $( [ "$(id -u)" = 0 ] && echo --allow-root ) "$@" ;;
  demo)
    setup_python; setup_names
    out="$ROOT/runs/02_fault_tolerant_training.out.ipynb"
    mkdir -p "$ROOT/runs"
    exec "$VENV/bin/monarch-nb" execute notebooks/02_fault_tolerant_training.ipynb -o "$out" "$@" ;;
  test)
    setup_python; setup_names
    if [ "${1:-}" = --quick ]; then
      shift
      log "running the quick lane (not slow, not slurm, not browser; more pytest arguments may follow)"
      exec "$PY" -m pytest -m "not slow and not slurm and not k8s and not browser" "$@"
    fi
    setup_browser
    log "starting the local SLURM cluster for the cluster tests"
    scripts/slurm_cluster.sh up
    trap 'scripts/slurm_cluster.sh down >/dev/null 2>&1 || true; scripts/k8s_cluster.sh down >/dev/null 2>&1 || true' EXIT
    log "starting the local Kubernetes cluster (the first time builds Kubernetes from its Go modules)"
    scripts/k8s_cluster.sh up
    log "running the test suite"
    MONARCH_NB_REQUIRE_SLURM=1 MONARCH_NB_REQUIRE_K8S=1 "$PY" -m pytest "$@" ;;
  k8s)
    # `up` also sets up the environment: a notebook can then use job=kubernetes at once.
    [ "${1:-status}" = up ] && setup_python
    exec scripts/k8s_cluster.sh "${1:-status}" "${@:2}" ;;
  slurm)
    # `up` also sets up the environment: it is all a fresh machine needs before
    # `.venv/bin/monarch-nb execute notebooks/05_cluster.ipynb`.
    [ "${1:-status}" = up ] && setup_python
    exec scripts/slurm_cluster.sh "${1:-status}" "${@:2}" ;;
  *)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
