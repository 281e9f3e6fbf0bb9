#!/usr/bin/env bash
# k8s_cluster.sh - a real one-machine Kubernetes cluster (control plane + N kubelet nodes) for
# tests, CI and notebooks of Monarch's KubernetesJob. Every component is Kubernetes' own, built
# from its Go modules by scripts/k8s_build.sh (cached outside the repo), on Debian's containerd,
# runc and CNI plugins.
#
#   scripts/k8s_cluster.sh up       # build if needed, start, wait until every node is Ready,
#                                   # merge context "monarch-nb" into the user's kubeconfig
#   scripts/k8s_cluster.sh down     # delete every pod, stop everything, remove what `up` made
#   scripts/k8s_cluster.sh status   # nodes and pods; exit 0 iff every node is Ready
#   scripts/k8s_cluster.sh stop-node nK | start-node nK   # a node's kubelet (a NotReady drill)
#
# Environment:
#   MONARCH_NB_K8S_DIR     scratch dir: certificates, etcd data, node roots, logs, pid files
#                          (default /var/tmp/monarch_nb_k8s)
#   MONARCH_NB_K8S_NODES   number of nodes (default 2: n1, n2; at most 9)
#   MONARCH_NB_K8S_CACHE   where built binaries and images are cached (default ~/.cache/monarch_nb/k8s)
#   KUBECONFIG             the kubeconfig `up` merges its context into (else ~/.kube/config)
#
# Layout (docs/kubernetes.md says why each setting is there):
# - etcd on 127.0.0.1:2379 (loopback only); kube-apiserver on port 6443 of every interface (pods
#   reach it at this machine's address; the kernel at 127.0.0.1) with TLS, client certificates, service-account keys, Node+RBAC authorization, anonymous requests refused;
#   kube-controller-manager and kube-scheduler with client certificates of their own.
# - Node nK: its own containerd (socket, root, state under the node's dir), its own kubelet (name
#   nK, root dir, ports 10250+10*(K-1) / healthz 10248+10*(K-1), cgroup root /mnb-nK), its own CNI
#   bridge mnbkK with pod subnet 10.244.K.0/24 (gateway 10.244.K.1 on this machine, so the
#   notebook kernel reaches every pod and every pod reaches the kernel). One containerd per node:
#   a kubelet kills running pods it does not know, so two kubelets must not share a runtime.
# - No registry is reachable: the sandbox image (our pause) and the worker image are built here
#   (scripts/k8s_images.sh) and imported into each node's containerd.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${MONARCH_NB_K8S_DIR:-/var/tmp/monarch_nb_k8s}"
NODES="${MONARCH_NB_K8S_NODES:-2}"
PKI="$DIR/pki"
RUN="$DIR/run"
LOGS="$DIR/logs"
CONTEXT=monarch-nb
API=https://127.0.0.1:6443
POD_NET=10.244
SERVICE_CIDR=10.96.0.0/16

log() { printf '\033[1m[k8s]\033[0m %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if [ "$(id -u)" != 0 ]; then exec sudo -E "$0" "$@"; fi

node_names() { local k; for k in $(seq 1 "$NODES"); do echo "n$k"; done; }
node_dir() { echo "$DIR/nodes/$1"; }
node_index() { echo "${1#n}"; }

node_ip() {  # this machine's address on its default route's interface (every node reports it)
  local dev; dev=$(ip -4 route show default 2>/dev/null | awk '{print $5; exit}')
  [ -n "$dev" ] && ip -4 -o addr show dev "$dev" | awk '{split($4, a, "/"); print a[1]; exit}'
}

bin_dir() { "$ROOT/scripts/k8s_build.sh"; }

kubectl_() { "$BIN/kubectl" --kubeconfig "$PKI/admin.kubeconfig" "$@"; }

ensure_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v umoci >/dev/null || missing+=(umoci)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# --- certificates ---------------------------------------------------------------------------

cert() {  # cert NAME CN [O] [SANS]: a key and a certificate signed by the cluster CA
  local name=$1 cn=$2 org=${3:-} sans=${4:-}
  [ -f "$PKI/$name.crt" ] && return 0
  local subj="/CN=$cn"; [ -n "$org" ] && subj="/O=$org$subj"
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  local ext="$PKI/$name.ext"
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$sans" ]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$sans"
    else echo "extendedKeyUsage=clientAuth"; fi; } > "$ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

kubeconfig() {  # kubeconfig FILE CERTNAME: a kubeconfig with embedded certificates
  local file=$1 who=$2
  "$BIN/kubectl" config set-cluster "$CONTEXT" --server="$API" --certificate-authority="$PKI/ca.crt" \
    --embed-certs=true --kubeconfig="$file" >/dev/null
  "$BIN/kubectl" config set-credentials "$CONTEXT-$who" --client-certificate="$PKI/$who.crt" \
    --client-key="$PKI/$who.key" --embed-certs=true --kubeconfig="$file" >/dev/null
  "$BIN/kubectl" config set-context "$CONTEXT" --cluster="$CONTEXT" --user="$CONTEXT-$who" \
    --kubeconfig="$file" >/dev/null
  "$BIN/kubectl" config use-context "$CONTEXT" --kubeconfig="$file" >/dev/null
}

make_pki() {
  mkdir -p "$PKI"; chmod 700 "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=monarch-nb-ca" -days 3650 -sha256 \
      -out "$PKI/ca.crt" 2>/dev/null
  fi
  [ -f "$PKI/sa.key" ] || { openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
                             openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null; }
  # Pods (a run's host, controller_on="cluster") reach the API at this machine's address, their
  # node's status.hostIP: the certificate names it (remade when the machine's address changed).
  if [ -f "$PKI/apiserver.crt" ] && ! openssl x509 -in "$PKI/apiserver.crt" -noout -ext subjectAltName 2>/dev/null \
      | grep -q "IP Address:$NODE_IP\(,\|$\)"; then rm -f "$PKI/apiserver.crt" "$PKI/apiserver.key"; fi
  cert apiserver kube-apiserver "" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost,IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP"
  cert admin monarch-nb-admin system:masters
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  local n; for n in $(node_names); do cert "kubelet-$n" "system:node:$n" system:nodes; done
  kubeconfig "$PKI/admin.kubeconfig" admin
  kubeconfig "$PKI/controller-manager.kubeconfig" controller-manager
  kubeconfig "$PKI/scheduler.kubeconfig" scheduler
  for n in $(node_names); do kubeconfig "$PKI/kubelet-$n.kubeconfig" "kubelet-$n"; done
}

# --- processes ------------------------------------------------------------------------------

start() {  # start NAME CMD...: run in its own session, log and pid file under the scratch dir
  local name=$1; shift
  if [ -f "$RUN/$name.pid" ] && kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then return 0; fi
  setsid "$@" >>"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/$name.pid"
}

stop() {  # stop NAME: TERM, then KILL after 10 s
  local name=$1 pid
  [ -f "$RUN/$name.pid" ] || return 0
  pid=$(cat "$RUN/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid"
}

wait_for() {  # wait_for SECONDS WHAT CMD...
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "$what did not come up in ${secs} s (logs: $LOGS)"
    sleep 0.2
  done
}

start_control_plane() {
  mkdir -p "$DIR/etcd"; chmod 700 "$DIR/etcd"
  start etcd "$BIN/etcd" --name monarch-nb --data-dir "$DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster monarch-nb=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
    --log-level warn
  wait_for 30 etcd curl -fsS http://127.0.0.1:2381/health
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --anonymous-auth=false \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --profiling=false \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --endpoint-reconciler-type=none --v=1
  wait_for 60 kube-apiserver kubectl_ get --raw /readyz
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --node-monitor-period=1s --node-monitor-grace-period=10s --profiling=false --v=1
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig="$PKI/scheduler.kubeconfig" \
    --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1
}

write_node_config() {  # the node's containerd, CNI and kubelet configuration
  local n=$1 k d
  k=$(node_index "$n"); d=$(node_dir "$n")
  mkdir -p "$d/cni" "$d/kubelet" "$d/pod-logs" "$d/containerd/root" "$d/containerd/state" "$d/opt"
  cat > "$d/containerd.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/monarch-nb/pause:1"
  restrict_oom_score_adj = true
  enable_unprivileged_ports = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni"
EOF
  cat > "$d/cni/10-monarch-nb.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "monarch-nb-$n",
  "plugins": [
    {"type": "bridge", "bridge": "mnbk$k", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$d/ipam",
              "ranges": [[{"subnet": "$POD_NET.$k.0/24", "gateway": "$POD_NET.$k.1"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
EOF
  cat > "$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: "unix://$d/containerd.sock"
cgroupDriver: cgroupfs
cgroupRoot: /mnb-$n
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: false
port: $((10250 + 10 * (k - 1)))
healthzPort: $((10248 + 10 * (k - 1)))
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
podLogsDir: "$d/pod-logs"
podCIDR: "$POD_NET.$k.0/24"
nodeLeaseDurationSeconds: 8
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
shutdownGracePeriod: 0s
EOF
}

make_cgroup_root() {  # the kubelet's cgroupRoot must exist in every v1 hierarchy it uses
  local n=$1 h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] || continue
    mkdir -p "$h/mnb-$n" 2>/dev/null || continue
    if [ -f "$h/cpuset.cpus" ]; then  # a v1 cpuset starts empty: give it its parent's
      cat "$h/cpuset.cpus" > "$h/mnb-$n/cpuset.cpus"; cat "$h/cpuset.mems" > "$h/mnb-$n/cpuset.mems"
    fi
  done
}

start_node() {
  local n=$1 k d
  k=$(node_index "$n"); d=$(node_dir "$n")
  make_cgroup_root "$n"
  # The node's bridge and its gateway address now, not at its first pod (the CNI plugin takes an
  # existing bridge as it is): a run's Lighthouse binds that address before any pod exists, and
  # on a fresh cluster it found none and advertised this machine's name, which no pod resolves.
  ip link show "mnbk$k" >/dev/null 2>&1 || ip link add "mnbk$k" type bridge
  ip addr replace "$POD_NET.$k.1/24" dev "mnbk$k"
  ip link set "mnbk$k" up
  start "containerd-$n" containerd --config "$d/containerd.toml"
  wait_for 30 "containerd of $n" ctr --address "$d/containerd.sock" version
  "$ROOT/scripts/k8s_images.sh" import "$d/containerd.sock"
  start "kubelet-$n" "$BIN/kubelet" --config="$d/kubelet.yaml" \
    --kubeconfig="$PKI/kubelet-$n.kubeconfig" --hostname-override="$n" --node-ip="$NODE_IP" \
    --root-dir="$d/kubelet" --cert-dir="$d/kubelet/pki" --v=1
}

nodes_ready() {  # every node Ready, and the node controller has lifted its not-ready taint (else nothing schedules)
  local ready tainted
  ready=$(kubectl_ get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c '=True$' || true)
  tainted=$(kubectl_ get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].key}{"\n"}{end}' 2>/dev/null | grep -c 'node.kubernetes.io/' || true)
  [ "$ready" -eq "$NODES" ] && [ "$tainted" -eq 0 ]
}

merge_user_kubeconfig() {
  local target="${KUBECONFIG:-$HOME/.kube/config}"
  target="${target%%:*}"
  mkdir -p "$(dirname "$target")"
  KUBECONFIG="$target:$PKI/admin.kubeconfig" "$BIN/kubectl" config view --flatten --raw > "$target.tmp.$$"
  mv "$target.tmp.$$" "$target"; chmod 600 "$target"
  [ -n "${SUDO_USER:-}" ] && chown "$SUDO_USER" "$target" 2>/dev/null || true
  log "context '$CONTEXT' merged into $target: kubectl --context $CONTEXT get nodes"
}

host_setup() {
  sysctl -qw net.ipv4.ip_forward=1
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  # Pod volumes that ask for mount propagation need a shared root (systemd makes / shared; no systemd here).
  mount --make-rshared / 2>/dev/null || true
}

up() {
  ensure_packages
  BIN="$(bin_dir)"
  NODE_IP="$(node_ip)"
  [ -n "$NODE_IP" ] || NODE_IP=127.0.0.1
  "$ROOT/scripts/k8s_images.sh" build
  local t0=$SECONDS
  mkdir -p "$RUN" "$LOGS"
  echo "$BIN" > "$RUN/bin"
  host_setup
  make_pki
  start_control_plane
  local n; for n in $(node_names); do write_node_config "$n"; start_node "$n"; done
  local end=$((SECONDS + 120))
  until nodes_ready; do
    [ $SECONDS -lt $end ] || { kubectl_ get nodes >&2 || true; die "nodes not Ready in 120 s (logs: $LOGS)"; }
    sleep 0.5
  done
  echo $((SECONDS - t0)) > "$RUN/up_seconds"
  # The namespace monarch_nb's KubernetesSpec uses by default.
  kubectl_ get namespace monarch >/dev/null 2>&1 || kubectl_ create namespace monarch >/dev/null
  merge_user_kubeconfig
  log "all $NODES nodes Ready in $((SECONDS - t0)) s"
  kubectl_ get nodes -o wide >&2
}

down() {
  BIN="$(cat "$RUN/bin" 2>/dev/null || true)"
  if [ -n "$BIN" ] && kubectl_ get --raw /readyz >/dev/null 2>&1; then
    # While the kubelets run they stop their pods properly (CNI teardown, sandbox netns removed):
    # first whatever would make pods again, then the pods.
    kubectl_ delete statefulsets,deployments,replicasets,daemonsets,jobs --all -A --wait=false >/dev/null 2>&1 || true
    kubectl_ delete pods --all -A --grace-period=0 --timeout=40s >/dev/null 2>&1 || true
  fi
  local n
  for n in $(node_names_present); do
    stop "kubelet-$n"
    remove_containers "$(node_dir "$n")/containerd.sock"
    stop "containerd-$n"
  done
  stop kube-scheduler; stop kube-controller-manager; stop kube-apiserver; stop etcd
  reap_leftovers
  # A cluster comes up empty (kind's rule): no object of the last one (a namespace left
  # terminating, a node's old registration) outlives `down`. Certificates and images are kept.
  rm -rf "$DIR/etcd" "$RUN/up_seconds"
  log "down: no process, mount, network namespace or iptables rule of the cluster left"
}

node_names_present() { ls "$DIR/nodes" 2>/dev/null || true; }

remove_containers() {  # whatever a stopped kubelet left: tasks, containers (containerd's own API)
  local sock=$1 c
  [ -S "$sock" ] || return 0
  for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr --address "$sock" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true
  done
  for c in $(ctr --address "$sock" -n k8s.io containers ls -q 2>/dev/null); do
    ctr --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true
    ctr --address "$sock" -n k8s.io containers delete "$c" >/dev/null 2>&1 || true
  done
}

reap_leftovers() {
  local pid
  # Shims of our containerds (their -address names our node dirs) and any process still in a pod cgroup.
  for pid in $(pgrep -f "containerd-shim.*$DIR/nodes" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
  local n k cg
  for n in $(node_names_present); do
    for cg in /sys/fs/cgroup/*/mnb-"$n"; do
      [ -d "$cg" ] || continue
      for pid in $(cat $(find "$cg" -name cgroup.procs) 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    done
  done
  # Mounts under the scratch dir (sandbox shm, overlay rootfs, pod volumes), deepest first.
  local m
  for m in $(awk -v d="$DIR" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null || true; done
  # Pod network namespaces containerd made (cni-*), our bridges and their routes.
  for m in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$m" 2>/dev/null || true; done
  for n in $(node_names_present); do
    k=$(node_index "$n"); ip link delete "mnbk$k" 2>/dev/null || true
    rm -rf "$(node_dir "$n")/ipam"
  done
  # Pod cgroups (empty now), deepest first.
  for n in $(node_names_present); do
    find /sys/fs/cgroup/*/mnb-"$n" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # iptables chains the kubelet made (KUBE-*) and any a CNI plugin made (CNI-*), IPv4 and IPv6.
  local tool; for tool in iptables ip6tables; do remove_chains "$tool"; done
}

remove_chains() {  # remove_chains iptables|ip6tables: the jumps to our chains, then the chains
  local tool=$1 table chain rule
  command -v "$tool" >/dev/null || return 0
  for table in filter nat mangle; do
    for chain in $(our_chains "$tool" "$table"); do
      { "$tool" -t "$table" -S 2>/dev/null || true; } | { grep -E -- "-j $chain( |$)" || true; } \
        | sed 's/^-A/-D/' | while read -r rule; do eval "$tool" -t "$table" "$rule" 2>/dev/null || true; done
    done
    for chain in $(our_chains "$tool" "$table"); do "$tool" -t "$table" -F "$chain" 2>/dev/null || true; done
    for chain in $(our_chains "$tool" "$table"); do "$tool" -t "$table" -X "$chain" 2>/dev/null || true; done
  done
}

our_chains() { { "$1" -t "$2" -S 2>/dev/null || true; } | awk '/^-N (KUBE-|CNI-)/{print $2}'; }

status() {
  BIN="$(cat "$RUN/bin" 2>/dev/null || true)"
  [ -n "$BIN" ] || { echo "cluster down"; return 1; }
  kubectl_ get nodes -o wide 2>/dev/null || { echo "API server not reachable"; return 1; }
  kubectl_ get pods -A -o wide 2>/dev/null || true
  nodes_ready
}

case "${1:-status}" in
  up) up ;;
  down) down ;;
  status) status ;;
  stop-node) stop "kubelet-${2:?node name}" ;;
  start-node)
    BIN="$(cat "$RUN/bin")"
    NODE_IP="$(node_ip)"
    start_node "${2:?node name}"
    end=$((SECONDS + 120))
    until nodes_ready; do [ $SECONDS -lt $end ] || die "node $2 not Ready again in 120 s"; sleep 0.5; done ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
