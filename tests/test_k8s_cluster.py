"""The one-machine Kubernetes cluster itself (scripts/k8s_cluster.sh, started by `./run.sh test`):
Kubernetes' own components, built from its Go modules, with TLS and RBAC on; two Ready nodes;
the `monarch-nb` context in the user's kubeconfig; every manifest monarch_nb ships or generates
admitted by the real API server's server-side dry run; `down` leaves no process, mount, network
namespace or iptables rule, and `up` from the cache is back within 60 s."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from monarch_nb.jobs import kubernetes as k8s
from monarch_nb.jobs import kubernetes_api as kapi

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("k8s_cluster")]

REPO = Path(__file__).resolve().parent.parent
API = "https://127.0.0.1:6443"
K8S_DIR = Path("/var/tmp/monarch_nb_k8s")


def kubectl(*args: str) -> subprocess.CompletedProcess:
    binary = (K8S_DIR / "run" / "bin").read_text().strip() + "/kubectl"
    return subprocess.run([binary, "--context", "monarch-nb", *args], capture_output=True, text=True, timeout=60)


def test_an_anonymous_request_is_refused_and_rbac_limits_an_account():
    context = ssl.create_default_context(cafile=str(K8S_DIR / "pki" / "ca.crt"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{API}/api/v1/namespaces", context=context, timeout=10)
    assert refused.value.code == 401
    # A node's own credentials may not list secrets cluster-wide (Node authorizer + RBAC).
    allowed = kubectl("auth", "can-i", "list", "secrets", "--all-namespaces", "--as", "system:node:n1",
                      "--as-group", "system:nodes")
    assert allowed.stdout.startswith("no"), allowed


def test_every_node_is_ready_and_runs_the_built_release():
    nodes = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["n1", "n2"]
    for node in nodes:
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", node["metadata"]["name"]
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.36.3" and info["containerRuntimeVersion"].startswith("containerd://")
    version = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"] == "v1.36.3"


def test_the_python_client_works_with_the_merged_context(k8s_cluster):
    from kubernetes import client

    with k8s_cluster.api() as api:
        names = [ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items]
    assert "monarch" in names and "kube-system" in names


@pytest.mark.parametrize("spec", [k8s.KubernetesSpec(hosts=2), k8s.KubernetesSpec(hosts=3, gpus_per_host=8,
                                                                                  shared_memory="16Gi"),
                                  k8s.KubernetesSpec(hosts=2, mode="operator")],
                         ids=["attach", "attach-gpus", "operator-rbac"])
def test_generated_manifests_pass_the_api_servers_dry_run(k8s_cluster, spec):
    docs = k8s.manifests(spec)
    if spec.mode == "operator":  # no MonarchMesh CRD here: the RBAC is what we generate
        assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "Role", "RoleBinding"}
    with k8s_cluster.api() as api:
        kapi.apply(api, [d for d in docs if d["kind"] != "Namespace"], dry_run=True)
        kapi.apply(api, [d for d in docs if d["kind"] == "Namespace"], dry_run=True)
    assert not k8s_cluster.project_pods(), "a dry run must store nothing"


@pytest.mark.parametrize("name", ["monarch-workers.yaml", "monarch-operator-rbac.yaml"])
def test_shipped_manifests_pass_the_api_servers_dry_run(k8s_cluster, name):
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / name).read_text()) if d]
    with k8s_cluster.api() as api:
        kapi.apply(api, docs, dry_run=True)


def test_a_manifest_the_api_server_refuses_is_named(k8s_cluster):
    (bad,) = [d for d in k8s.manifests(k8s.KubernetesSpec(hosts=2)) if d["kind"] == "StatefulSet"]
    bad["spec"]["replicas"] = -1
    with k8s_cluster.api() as api, pytest.raises(kapi.KubernetesPodError, match=r"StatefulSet 'workers'.*replicas"):
        kapi.apply(api, [bad], dry_run=True)


def _leftovers() -> dict[str, list[str]]:
    procs = subprocess.run(["pgrep", "-af", "kube-apiserver|kube-controller|kube-scheduler|kubelet|"
                            "/etcd |containerd|pause"], capture_output=True, text=True).stdout.splitlines()
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if str(K8S_DIR) in line.split()[1]]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    rules = [line for tool in ("iptables-save", "ip6tables-save")
             for line in subprocess.run([tool], capture_output=True, text=True).stdout.splitlines()
             if "KUBE-" in line or "CNI-" in line or "mnbk" in line]
    links = [line for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
             if "mnbk" in line]
    return {"processes": [p for p in procs if "pgrep" not in p], "mounts": mounts,
            "network namespaces": [n for n in netns if n.startswith("cni-")], "iptables rules": rules,
            "links": links}


def test_down_leaves_nothing_and_up_from_the_cache_is_ready_within_60_s(k8s_cluster):
    """Runs last in this module: stops the cluster with a pod running, checks every kind of
    leftover, then starts it again for the rest of the suite."""
    created = kubectl("-n", "monarch", "run", "sleeper", "--image", "docker.io/monarch-nb/worker:1",
                      "--image-pull-policy", "Never", "--command", "--", "/usr/bin/python3.11", "-c",
                      "import time; time.sleep(3600)")
    assert created.returncode == 0, created.stderr
    deadline = time.monotonic() + 60
    while kubectl("-n", "monarch", "get", "pod", "sleeper", "-o", "jsonpath={.status.phase}").stdout != "Running":
        assert time.monotonic() < deadline, "the sleeper pod never ran"
        time.sleep(0.5)
    down = k8s_cluster.run("down")
    assert down.returncode == 0, down.stderr
    left = {kind: items for kind, items in _leftovers().items() if items}
    try:
        assert not left, f"`down` left behind: {left}"
    finally:
        t0 = time.monotonic()
        up = k8s_cluster.run("up")
        took = time.monotonic() - t0
    assert up.returncode == 0, up.stderr[-2000:]
    assert took < 60, f"up from the cache took {took:.0f} s"
