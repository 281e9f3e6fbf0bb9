"""Kubernetes placement, tested WITHOUT a cluster: no API server is reachable from this machine.

What runs here: KubernetesSpec validation, its mapping onto the argument names of the installed
Monarch's KubernetesJob / add_mesh / ImageSpec (read from Monarch's source, and from the live
signature when the `kubernetes` package is installed), the generated manifests, and the shipped
YAML in deploy/kubernetes/. Calls into Monarch's KubernetesJob are simulated with stand-ins.
Nothing here applies a manifest or talks to Kubernetes.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
import time
import types
from pathlib import Path

import pytest

from monarch_nb.jobs import kubernetes as k8s

from helpers.fresh_process import in_a_fresh_process
from monarch_nb.jobs.kubernetes import KubernetesSpec, KubernetesUnavailableError

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
SHIPPED = {
    "monarch-workers.yaml": KubernetesSpec(hosts=2),
    "monarch-operator-rbac.yaml": KubernetesSpec(hosts=2, mode="operator"),
}


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in docs}


def worker_container(spec: KubernetesSpec) -> dict:
    return by_kind(k8s.manifests(spec))["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]


def monarch_source_api() -> dict[str, tuple[list[str], list[str]]]:
    """(all parameters, required parameters) of Monarch's KubernetesJob API, read from its source.

    Parsing the source needs no `kubernetes` package, so this check runs on every machine.
    """
    origin = importlib.util.find_spec("monarch._src.job.kubernetes").origin
    tree = ast.parse(Path(origin).read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def params(cls: str, method: str) -> tuple[list[str], list[str]]:
        fn = next(n for n in classes[cls].body if isinstance(n, ast.FunctionDef) and n.name == method)
        positional = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]  # drop self
        required = positional[: len(positional) - len(fn.args.defaults)]
        required += [a.arg for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is None]
        return positional + [a.arg for a in fn.args.kwonlyargs], required

    image_fields = [n.target.id for n in classes["ImageSpec"].body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return {"init": params("KubernetesJob", "__init__"), "add_mesh": params("KubernetesJob", "add_mesh"),
            "image_spec": (image_fields, ["image"])}


# --- validation ------------------------------------------------------------------------------

def test_defaults_validate_in_both_modes_without_a_cluster():
    assert KubernetesSpec().validate() == KubernetesSpec()
    KubernetesSpec(mode="operator", hosts=3, gpus_per_host=8, shared_memory="16Gi").validate()


@pytest.mark.parametrize("kwargs, field", [
    ({"mode": "helm"}, "mode"),
    ({"image": ""}, "image"),
    ({"namespace": "My_NS"}, "namespace"),
    ({"mesh": "my-workers"}, "mesh"),          # Monarch: lowercase alphanumeric only
    ({"mesh": "9workers"}, "mesh"),
    ({"mesh": "a" * 53}, "mesh"),
    ({"hosts": 0}, "hosts"),
    ({"hosts": True}, "hosts"),
    ({"port": 70000}, "port"),
    ({"gpus_per_host": -1}, "gpus_per_host"),
    ({"gpu_resource": "gpu"}, "gpu_resource"),
    ({"cpu": "eight"}, "cpu"),
    ({"memory": "64 GB"}, "memory"),
    ({"shared_memory": "lots"}, "shared_memory"),
    ({"env": {"1BAD": "x"}}, "env"),
    ({"mode": "operator", "env": {"A": "b"}}, "env"),
    ({"labels": {"bad key": "v"}}, "labels"),
    ({"label_selector": "app in (a,b)"}, "label_selector"),
    ({"mode": "operator", "label_selector": "a=b"}, "label_selector"),
    ({"mode": "operator", "pod_rank_label": "volcano.sh/task-index"}, "pod_rank_label"),
    ({"service_account": "Kernel SA"}, "service_account"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"kubeconfig": ""}, "kubeconfig"),
    ({"attach_to": "127.0.0.1:26600"}, "attach_to"),
])
def test_validation_errors_name_the_field_without_a_cluster(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        KubernetesSpec(**kwargs).validate()


def test_validation_error_lists_the_allowed_modes_without_a_cluster():
    with pytest.raises(ValueError, match="attach, operator"):
        KubernetesSpec(mode="helm").validate()


def test_with_shape_fills_hosts_and_refuses_conflicts_without_a_cluster():
    assert k8s.with_shape(KubernetesSpec(), hosts=4, procs=2).hosts == 4
    assert k8s.with_shape(KubernetesSpec(hosts=4), hosts=4, procs=2).hosts == 4
    with pytest.raises(ValueError, match=r"^hosts: the KubernetesSpec says 4 pods but up\(\) asked for 2"):
        k8s.with_shape(KubernetesSpec(hosts=4), hosts=2, procs=1)
    with pytest.raises(ValueError, match=r"^procs: 8 processes per host but each pod asks for 4 GPUs"):
        k8s.with_shape(KubernetesSpec(gpus_per_host=4), hosts=1, procs=8)
    with pytest.raises(ValueError, match=r"^procs: "):
        k8s.with_shape(KubernetesSpec(), hosts=1, procs=0)


# --- mapping onto Monarch's KubernetesJob ----------------------------------------------------

def test_spec_maps_to_kubernetes_job_arguments_without_a_cluster():
    spec = KubernetesSpec(namespace="team", mesh="trainers", hosts=3, port=27000, timeout_s=90,
                          kubeconfig="~/.kube/config", attach_to="tcp://127.0.0.1:27000")
    args = k8s.kubernetes_job_arguments(spec)
    assert args.init == {"namespace": "team", "timeout": 90, "kubeconfig": "~/.kube/config",
                         "attach_to": "tcp://127.0.0.1:27000"}
    assert args.add_mesh == {
        "name": "trainers", "num_replicas": 3, "port": 27000,
        "label_selector": "app.kubernetes.io/name=monarch-worker,monarch.pytorch.org/mesh-name=trainers",
        "pod_rank_label": "apps.kubernetes.io/pod-index",
    }
    assert args.image_spec is None  # attach mode: Monarch provisions nothing


def test_operator_spec_maps_to_image_spec_without_a_cluster():
    spec = KubernetesSpec(mode="operator", hosts=2, image="reg/monarch-nb:0.1.0", gpus_per_host=8,
                          memory="512Gi", shared_memory="16Gi", labels={"kueue.x-k8s.io/queue-name": "q"})
    args = k8s.kubernetes_job_arguments(spec)
    assert args.add_mesh == {"name": "workers", "num_replicas": 2, "port": 26600,
                             "labels": {"kueue.x-k8s.io/queue-name": "q"}}
    assert args.image_spec == {"image": "reg/monarch-nb:0.1.0",
                               "resources": {"nvidia.com/gpu": "8", "memory": "512Gi"},
                               "shared_memory_size": "16Gi"}
    cpu_only = k8s.kubernetes_job_arguments(KubernetesSpec(mode="operator", hosts=1))
    assert cpu_only.image_spec["resources"] is None


def test_mapping_needs_hosts_without_a_cluster():
    with pytest.raises(ValueError, match=r"^hosts: unset"):
        k8s.kubernetes_job_arguments(KubernetesSpec())


@pytest.mark.parametrize("spec", [KubernetesSpec(hosts=2, kubeconfig="k", attach_to="tcp://h:1"),
                                  KubernetesSpec(hosts=2, mode="operator", labels={"a": "b"}, gpus_per_host=1)],
                         ids=["attach", "operator"])
def test_argument_names_exist_in_monarchs_kubernetes_job_source_without_a_cluster(spec):
    """A Monarch upgrade that renames or adds a required argument fails here, kubernetes or not."""
    api = monarch_source_api()
    args = k8s.kubernetes_job_arguments(spec)
    for kind, given in (("init", args.init), ("add_mesh", args.add_mesh), ("image_spec", args.image_spec or {})):
        known, required = api[kind]
        assert set(given) <= set(known), f"{kind}: Monarch has no {sorted(set(given) - set(known))}"
        if given:
            assert set(required) <= set(given) | ({"image_spec"} if kind == "add_mesh" else set())


def test_argument_names_match_the_live_signature_without_a_cluster():
    pytest.importorskip("kubernetes", reason="Monarch's monarch.job.kubernetes imports the `kubernetes` "
                        "package, which is not installed; the source-level test above covers the names")
    from monarch.job.kubernetes import ImageSpec, KubernetesJob

    args = k8s.kubernetes_job_arguments(KubernetesSpec(hosts=2, mode="operator", labels={"a": "b"}))
    inspect.signature(KubernetesJob.__init__).bind(None, **args.init)
    assert set(args.add_mesh) <= set(inspect.signature(KubernetesJob.add_mesh).parameters)
    inspect.signature(ImageSpec).bind(**args.image_spec)


class _FakeMonarchKubernetes(types.ModuleType):
    """Stands in for monarch.job.kubernetes: records what make_kubernetes_job asks of it."""

    def __init__(self) -> None:
        super().__init__("monarch.job.kubernetes")
        calls = self.calls = []

        class KubernetesJob:
            def __init__(self, **kwargs):
                calls.append(("init", kwargs))

            def add_mesh(self, **kwargs):
                calls.append(("add_mesh", kwargs))

        class ImageSpec:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class KubeConfig:
            @classmethod
            def from_path(cls, path):
                return ("KubeConfig", path)

        self.KubernetesJob, self.ImageSpec, self.KubeConfig = KubernetesJob, ImageSpec, KubeConfig


def test_make_kubernetes_job_passes_mapped_arguments_simulated_without_a_cluster(monkeypatch):
    fake = _FakeMonarchKubernetes()
    monkeypatch.setitem(sys.modules, "kubernetes", types.ModuleType("kubernetes"))
    monkeypatch.setitem(sys.modules, "monarch.job.kubernetes", fake)
    k8s.make_kubernetes_job(KubernetesSpec(mode="operator", hosts=2, kubeconfig="/kc", gpus_per_host=4))
    (_, init), (_, add_mesh) = fake.calls
    assert init["kubeconfig"] == ("KubeConfig", "/kc")
    assert add_mesh["image_spec"].kwargs["resources"] == {"nvidia.com/gpu": "4"}
    assert add_mesh["num_replicas"] == 2


def test_missing_kubernetes_package_error_names_the_fix_simulated_without_a_cluster(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "monarch.job.kubernetes", raising=False)
    with pytest.raises(KubernetesUnavailableError, match=r"^kubernetes: .*pip install kubernetes") as info:
        k8s.make_kubernetes_job(KubernetesSpec(hosts=1))
    assert isinstance(info.value, ImportError)


def test_monarchs_own_missing_package_error_is_translated_simulated_without_a_cluster(monkeypatch):
    real_import = importlib.import_module

    def fake_import(name, package=None):
        if name == "kubernetes":
            return types.ModuleType("kubernetes")
        if name == "monarch.job.kubernetes":  # what Monarch raises when `import kubernetes` fails
            raise RuntimeError("please install kubernetes to use KubernetesJob. `pip install kubernetes`")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(KubernetesUnavailableError, match="pip install kubernetes"):
        k8s.make_kubernetes_job(KubernetesSpec(hosts=1))


# --- generated manifests ---------------------------------------------------------------------

def test_attach_manifest_labels_match_the_job_selector_without_a_cluster():
    spec = KubernetesSpec(hosts=3, mesh="trainers", labels={"kueue.x-k8s.io/queue-name": "q"})
    docs = by_kind(k8s.manifests(spec))
    selector = dict(pair.split("=") for pair in k8s.kubernetes_job_arguments(spec).add_mesh["label_selector"].split(","))
    sts = docs["StatefulSet"]
    assert sts["spec"]["selector"]["matchLabels"] == selector
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pod_labels == {**selector, "kueue.x-k8s.io/queue-name": "q"}  # the selector's, plus the spec's
    assert docs["Service"]["spec"]["selector"] == selector
    assert sts["metadata"]["labels"] == {**selector, "kueue.x-k8s.io/queue-name": "q"}
    # pods sharing the spec's labels spread over the nodes (a run's pod sets, each its own selector)
    (spread,) = sts["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == {"kueue.x-k8s.io/queue-name": "q"}
    assert docs["PodDisruptionBudget"]["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert sts["spec"]["replicas"] == 3 and sts["metadata"]["name"] == "trainers"
    assert sts["spec"]["serviceName"] == docs["Service"]["metadata"]["name"]
    assert {d["metadata"].get("namespace") for d in docs.values() if d["kind"] != "Namespace"} == {"monarch"}


def test_custom_selector_labels_the_pods_and_custom_rank_label_is_refused_without_a_cluster():
    spec = KubernetesSpec(hosts=1, label_selector="team=ml, job=run7")
    sts = by_kind(k8s.manifests(spec))["StatefulSet"]
    assert sts["spec"]["template"]["metadata"]["labels"] == {"team": "ml", "job": "run7"}
    assert k8s.kubernetes_job_arguments(spec).add_mesh["label_selector"] == "team=ml,job=run7"
    with pytest.raises(ValueError, match=r"^pod_rank_label: "):
        k8s.manifests(KubernetesSpec(hosts=1, pod_rank_label="volcano.sh/task-index"))


def test_attach_manifest_ports_env_and_worker_command_without_a_cluster():
    spec = KubernetesSpec(hosts=2, port=27001)
    docs = by_kind(k8s.manifests(spec))
    container = worker_container(spec)
    env = {e["name"]: e for e in container["env"]}
    # KubernetesJob._discover_monarch_port reads the literal value of MONARCH_PORT.
    assert env["MONARCH_PORT"] == {"name": "MONARCH_PORT", "value": "27001"}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["MONARCH_NB_VERSIONS"]["value"].split() == [
        f"torchmonarch=={importlib.metadata.version('torchmonarch')}",
        f"monarch_nb=={importlib.metadata.version('monarch_nb')}"]
    assert env["GLOO_SOCKET_IFNAME"]["value"] == "eth0"  # never monarch_nb's single-machine "lo"
    assert container["ports"] == [{"name": "monarch", "containerPort": 27001}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "monarch"}
    assert docs["Service"]["spec"]["ports"] == [{"name": "monarch", "port": 27001}]
    assert docs["Service"]["spec"]["clusterIP"] == "None"
    assert container["command"][:3] == ["python", "-u", "-c"]
    script = container["command"][3]
    compile(script, "worker", "exec")
    # Attach mode dials tcp://<pod IP>:<port> with no service id: the worker must advertise exactly that.
    assert 'address=f"tcp://{ip}:{port}@tcp://0.0.0.0:{port}"' in script
    assert "run_worker_loop_forever" in script
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_worker_env_overrides_the_defaults_without_a_cluster():
    env = {e["name"]: e.get("value") for e in worker_container(
        KubernetesSpec(hosts=1, env={"GLOO_SOCKET_IFNAME": "net1", "NCCL_DEBUG": "INFO"}))["env"]}
    assert env["GLOO_SOCKET_IFNAME"] == "net1" and env["NCCL_DEBUG"] == "INFO"


def test_gpu_resources_only_when_asked_without_a_cluster():
    assert "resources" not in worker_container(KubernetesSpec(hosts=1))
    gpu = worker_container(KubernetesSpec(hosts=1, gpus_per_host=8, cpu="90", memory="1Ti"))["resources"]
    assert gpu["limits"] == gpu["requests"] == {"nvidia.com/gpu": "8", "cpu": "90", "memory": "1Ti"}
    rocm = worker_container(KubernetesSpec(hosts=1, gpus_per_host=8, gpu_resource="amd.com/gpu"))["resources"]
    assert rocm["limits"] == {"amd.com/gpu": "8"}
    assert worker_container(KubernetesSpec(hosts=1, cpu="4"))["resources"]["limits"] == {"cpu": "4"}


def test_shared_memory_volume_only_when_asked_without_a_cluster():
    spec = KubernetesSpec(hosts=1, shared_memory="16Gi")
    pod = by_kind(k8s.manifests(spec))["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "volumes" not in by_kind(k8s.manifests(KubernetesSpec(hosts=1)))["StatefulSet"]["spec"]["template"]["spec"]


def test_operator_manifests_are_rbac_only_without_a_cluster():
    docs = k8s.manifests(KubernetesSpec(mode="operator"))  # hosts not needed: KubernetesJob makes the mesh
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "Role", "RoleBinding"]
    rules = {tuple(r["resources"]): set(r["verbs"]) for r in by_kind(docs)["Role"]["rules"]}
    assert {"create", "patch", "delete", "get"} <= rules[("monarchmeshes",)]
    assert {"get", "list", "watch"} <= rules[("pods",)]
    attach_rules = by_kind(k8s.manifests(KubernetesSpec(hosts=1)))["Role"]["rules"]
    assert [r["resources"] for r in attach_rules] == [["pods"]]


def test_attach_manifests_need_hosts_without_a_cluster():
    with pytest.raises(ValueError, match=r"^hosts: "):
        k8s.manifests(KubernetesSpec())


# --- YAML and the shipped files --------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    KubernetesSpec(hosts=2),
    KubernetesSpec(hosts=2, gpus_per_host=8, shared_memory="16Gi", labels={"kueue.x-k8s.io/queue-name": "q"},
                   env={"A": "true", "B": "", "C": "0123", "D": "a: b #c", "E": "ünï", "F": "l1\nl2", "G": "-x"}),
    KubernetesSpec(mode="operator"),
], ids=["attach", "attach-tricky-values", "operator"])
def test_rendered_yaml_parses_back_to_the_manifests_without_a_cluster(spec):
    yaml = pytest.importorskip("yaml", reason="PyYAML (a transitive dependency here) checks the emitter")
    assert list(yaml.safe_load_all(k8s.manifest_text(spec))) == k8s.manifests(spec)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_yaml_equals_generator_output_without_a_cluster(name):
    shipped = (DEPLOY / name).read_text()
    assert shipped == k8s.manifest_text(SHIPPED[name]), (
        f"deploy/kubernetes/{name} is stale; regenerate it with "
        f"python -m monarch_nb.jobs.kubernetes{' --mode operator' if 'operator' in name else ''} > deploy/kubernetes/{name}")


def test_command_line_defaults_print_the_shipped_example_without_a_cluster(capsys):
    assert k8s.main([]) == 0
    assert capsys.readouterr().out == (DEPLOY / "monarch-workers.yaml").read_text()
    assert k8s.main(["--mode", "operator"]) == 0
    assert capsys.readouterr().out == (DEPLOY / "monarch-operator-rbac.yaml").read_text()


def test_command_line_reports_the_bad_field_without_a_cluster(capsys):
    with pytest.raises(SystemExit) as info:
        k8s.main(["--mesh", "my-workers"])
    assert info.value.code == 2
    assert "mesh: 'my-workers'" in capsys.readouterr().err


def test_a_kubernetes_mesh_after_a_local_one_is_refused_at_once_with_the_fix_without_a_cluster(tmp_path):
    """Monarch picks its transport once per process: after a local mesh its client serves a Unix
    socket the pods cannot reach. Refused before any API call (the kubeconfig names no server),
    not after the attach's 60 s wait. In a process of its own: this one's client may already
    serve a pod-facing address (the suite runs its Kubernetes mesh tests first)."""
    in_a_fresh_process(_refused_after_a_local_mesh, str(tmp_path / "kubeconfig"), timeout=120)


def _refused_after_a_local_mesh(kubeconfig: str) -> None:
    from monarch_nb import Session
    from monarch_nb.seam_cluster import ClientUnreachable

    with Session(default_timeout=30) as session:
        session.up("here", procs=1)
        started = time.monotonic()
        try:
            session.up("pods", procs=1, hosts=1, job=k8s.KubernetesSpec(kubeconfig=kubeconfig, context="none"))
            raise AssertionError("a Kubernetes mesh after a local one was not refused")
        except ClientUnreachable as refused:
            message = str(refused)
        assert time.monotonic() - started < 5
        assert "the pods of a Kubernetes mesh" in message and "ipc://" in message, message
        assert "bring up the cluster mesh first" in message and "%monarch train --name" in message, message
        assert [h.name for h in session.snapshot()] == ["here"]
