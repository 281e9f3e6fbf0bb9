"""Kubernetes placement: a ``KubernetesSpec`` becomes a pod set and Monarch's ``KubernetesJob`` on it.

Monarch 0.7.0's ``KubernetesJob`` has two modes and both map from one spec: ``"attach"`` (default)
finds pods by label, and monarch_nb makes those pods itself - one pod set (a StatefulSet and its
headless Service) per host mesh, created through the ``kubernetes`` client when the mesh comes up
and deleted when it is released (``kubernetes_api``); ``"operator"`` makes KubernetesJob create
``MonarchMesh`` resources that monarch-operator 0.2.x (installed separately, Helm) turns into
pods, so we generate only the controller's RBAC. Manifests are plain dicts, written as YAML by
PyYAML. Runs on the real one-machine cluster of ``scripts/k8s_cluster.sh`` in the tests
(``local_k8s``); operator mode has not met a cluster (its operator comes from no registry here).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal, Mapping, Sequence

import yaml

from monarch_nb.errors import MonarchNbError


Mode = Literal["attach", "operator"]
MODES: tuple[str, ...] = ("attach", "operator")

DEFAULT_PORT = 26600  # KubernetesJob's default monarch port (SlurmJob's is 22222)
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set on StatefulSet pods since Kubernetes 1.28
APP_LABEL, APP_VALUE = "app.kubernetes.io/name", "monarch-worker"  # KubernetesJob's default selector
MESH_LABEL = "monarch.pytorch.org/mesh-name"

# monarch_nb._runtime defaults GLOO_SOCKET_IFNAME to "lo" (right on one machine, wrong across pods)
# unless it is already set, so worker pods name their pod interface. KubernetesSpec.env overrides.
WORKER_ENV: dict[str, str] = {
    "GLOO_SOCKET_IFNAME": "eth0",
    "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "1s",
}

# What an "attach" worker pod runs. KubernetesJob dials attach-mode pods at tcp://<pod IP>:<port>
# with Monarch's legacy identity, which only works if the worker advertises that exact address
# (checked locally: advertising the hostname and dialling the IP leaves messages undeliverable).
# The version check turns a mismatched image into a readable CrashLoopBackOff log line.
WORKER_SCRIPT = """\
import os, sys
from importlib.metadata import PackageNotFoundError, version
for pin in os.environ.get("MONARCH_NB_VERSIONS", "").split():
    dist, want = pin.split("==")
    try:
        have = version(dist)
    except PackageNotFoundError:
        have = "not installed"
    if have != want:
        sys.exit(f"monarch_nb worker: this image has {dist} {have} but the notebook kernel has {want}; "
                 "rebuild the image with the kernel's versions (deploy/kubernetes/README.md)")
from monarch.actor import run_worker_loop_forever
ip, port = os.environ["POD_IP"], os.environ["MONARCH_PORT"]
run_worker_loop_forever(address=f"tcp://{ip}:{port}@tcp://0.0.0.0:{port}", ca="trust_all_connections")
"""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class KubernetesUnavailableError(MonarchNbError, ImportError):
    """Monarch's KubernetesJob cannot be imported because the ``kubernetes`` package is missing."""


@dataclass(frozen=True)
class KubernetesSpec:
    """A Monarch host mesh on Kubernetes, one pod per host, as a monarch_nb user asks for it.

    Every field maps to a ``KubernetesJob``/``add_mesh``/``ImageSpec`` argument or to a field of
    the generated manifests; ``hosts=None`` means "take it from ``Session.up(hosts=...)``".
    """

    image: str = "monarch-nb:0.1.0"  # worker image: same torchmonarch and monarch_nb as the kernel
    namespace: str = "monarch"
    mesh: str = "workers"  # MonarchMesh/StatefulSet name and the attribute of Monarch's JobState
    hosts: int | None = None  # pods (num_replicas)
    mode: Mode = "attach"
    port: int = DEFAULT_PORT
    gpus_per_host: int = 0  # 0: no GPU resource requested at all
    gpu_resource: str = "nvidia.com/gpu"  # "amd.com/gpu" on ROCm nodes
    cpu: str | None = None  # Kubernetes quantities, requested and limited alike (as Monarch does)
    memory: str | None = None
    shared_memory: str | None = None  # size of a memory-backed /dev/shm (NCCL, data loaders)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)  # attach only: extra worker env
    # on the StatefulSet / MonarchMesh (e.g. Kueue) and its pods; pods sharing them spread over the nodes
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    label_selector: str | None = None  # attach only: "k=v,k2=v2"; default selects our StatefulSet
    pod_rank_label: str = POD_INDEX_LABEL  # attach only: pod label holding the host rank
    service_account: str = "monarch-controller"  # the notebook kernel pod's account (RBAC)
    timeout_s: int | None = 600  # KubernetesJob: seconds to wait for ready pods; None = forever
    kubeconfig: str | None = None  # path, for a kernel outside the cluster; None = in-cluster
    attach_to: str | None = None  # "tcp://127.0.0.1:PORT" of your own port-forward to a worker
    context: str | None = None  # the kubeconfig's context (None: its current one)
    python: str = "python"  # the worker's interpreter inside the pod (on PATH in the image)
    # hostPath volumes mounted at the same path in every pod: read-only (code and environment on
    # the one-machine cluster) and writable (a run's directory); a real cluster bakes the code into
    # the image and leaves these empty.
    host_paths: tuple[str, ...] = ()
    writable_paths: tuple[str, ...] = ()
    image_pull_policy: str = "IfNotPresent"
    working_dir: str | None = None  # the worker's directory in the pod (None: the image's)
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    # attach: monarch_nb creates a pod set per mesh and deletes it on release (False: attach to
    # pods you made from the generated manifests, and leave them to you)
    create_pods: bool = True
    # where Monarch's client listens for its pods: "auto" - with a kubeconfig (a kernel outside
    # the cluster that routes to pod IPs, as on the one-machine cluster) the local address that
    # routes to the first pod, in-cluster Monarch's own choice; or an explicit IP address
    client_address: str | None = "auto"
    # mount the session's directory (workers' logs, a run's files) writable at the same path in
    # every pod: on the one-machine cluster workers then write where local workers do
    mount_session_dir: bool = False

    def validate(self) -> KubernetesSpec:
        """Raise ValueError naming the first bad field and what it accepts; return self."""
        attach = self.mode == "attach"
        checks: list[tuple[str, bool, str]] = [
            ("mode", self.mode in MODES, f"{self.mode!r} is not one of {', '.join(MODES)}"),
            ("image", bool(self.image) and not re.search(r"\s", self.image),
             f"{self.image!r} is not a container image reference (e.g. registry/monarch-nb:0.1.0)"),
            ("namespace", _fits(_DNS_LABEL, self.namespace, 63),
             f"{self.namespace!r} is not a namespace name (lowercase letters, digits, '-', at most 63)"),
            ("mesh", isinstance(self.mesh, str) and re.fullmatch(r"[a-z][a-z0-9]{0,51}", self.mesh) is not None,
             f"{self.mesh!r}: Monarch needs lowercase letters and digits starting with a letter, "
             "and a StatefulSet name allows at most 52 characters (no '-')"),
            ("hosts", self.hosts is None or _positive(self.hosts), f"{self.hosts!r} is not a positive integer"),
            ("port", _int(self.port) and 1 <= self.port <= 65535, f"{self.port!r} is not a TCP port (1-65535)"),
            ("gpus_per_host", _int(self.gpus_per_host) and self.gpus_per_host >= 0,
             f"{self.gpus_per_host!r} is not a GPU count (0 or more)"),
            ("gpu_resource", _fits(_RESOURCE, self.gpu_resource, 253),
             f"{self.gpu_resource!r} is not an extended resource name such as nvidia.com/gpu or amd.com/gpu"),
            ("cpu", self.cpu is None or _fits(_QUANTITY, self.cpu), f"{self.cpu!r} is not a quantity (e.g. 8, 500m)"),
            ("memory", self.memory is None or _fits(_QUANTITY, self.memory),
             f"{self.memory!r} is not a quantity (e.g. 64Gi)"),
            ("shared_memory", self.shared_memory is None or _fits(_QUANTITY, self.shared_memory),
             f"{self.shared_memory!r} is not a quantity (e.g. 16Gi)"),
            ("env", attach or not self.env,
             "operator mode cannot set worker env (Monarch's ImageSpec has no env field); "
             "bake it into the image (deploy/kubernetes/Dockerfile) or use mode='attach'"),
            ("env", all(_fits(_ENV_NAME, k) and isinstance(v, str) for k, v in self.env.items()),
             f"{dict(self.env)!r}: names must be shell identifiers and values strings"),
            ("labels", all(_fits(_LABEL_KEY, k, 316) and _fits(_LABEL_VALUE, v, 63) for k, v in self.labels.items()),
             f"{dict(self.labels)!r} are not Kubernetes labels (key [prefix/]name, value up to 63 characters)"),
            ("label_selector", self.label_selector is None or attach,
             "operator mode selects the pods the operator labels; drop label_selector or use mode='attach'"),
            ("label_selector", self.label_selector is None or _parse_selector(self.label_selector) is not None,
             f"{self.label_selector!r} is not 'key=value[,key=value]' (only equality selectors)"),
            ("pod_rank_label", attach or self.pod_rank_label == POD_INDEX_LABEL,
             f"operator mode ranks pods by {POD_INDEX_LABEL}; drop pod_rank_label or use mode='attach'"),
            ("pod_rank_label", _fits(_LABEL_KEY, self.pod_rank_label, 316),
             f"{self.pod_rank_label!r} is not a label key"),
            ("service_account", _fits(_DNS_SUBDOMAIN, self.service_account, 253),
             f"{self.service_account!r} is not a service account name"),
            ("timeout_s", self.timeout_s is None or _positive(self.timeout_s),
             f"{self.timeout_s!r} is not a positive number of seconds (or None to wait forever)"),
            ("kubeconfig", self.kubeconfig is None or (isinstance(self.kubeconfig, str) and self.kubeconfig != ""),
             f"{self.kubeconfig!r} is not a path (None means in-cluster config)"),
            ("python", isinstance(self.python, str) and bool(self.python.strip()),
             f"{self.python!r} is not an interpreter path or name"),
            ("host_paths", all(isinstance(p, str) and p.startswith("/") for p in (*self.host_paths,
                                                                                   *self.writable_paths)),
             f"{self.host_paths!r} / {self.writable_paths!r}: hostPath volumes need absolute paths"),
            ("working_dir", self.working_dir is None or (isinstance(self.working_dir, str)
                                                         and self.working_dir.startswith("/")),
             f"{self.working_dir!r} is not an absolute path"),
            ("image_pull_policy", self.image_pull_policy in ("Always", "IfNotPresent", "Never"),
             f"{self.image_pull_policy!r} is not one of Always, IfNotPresent, Never"),
            ("node_selector", all(_fits(_LABEL_KEY, k, 316) and _fits(_LABEL_VALUE, v, 63)
                                  for k, v in self.node_selector.items()),
             f"{dict(self.node_selector)!r} is not a node selector (label key = value)"),
            ("attach_to", self.attach_to is None or (isinstance(self.attach_to, str)
                                                      and self.attach_to.startswith("tcp://")),
             f"{self.attach_to!r} is not a 'tcp://host:port' address"),
        ]
        for name, ok, problem in checks:
            if not ok:
                raise ValueError(f"{name}: {problem}")
        return self


def with_shape(spec: KubernetesSpec, *, hosts: int, procs: int) -> KubernetesSpec:
    """The spec for ``Session.up(hosts=..., procs=..., job=spec)``: fills ``hosts``, refuses conflicts."""
    if not _positive(hosts):
        raise ValueError(f"hosts: {hosts!r} is not a positive integer")
    if not _positive(procs):
        raise ValueError(f"procs: {procs!r} is not a positive integer")
    if spec.hosts is not None and spec.hosts != hosts:
        raise ValueError(f"hosts: the KubernetesSpec says {spec.hosts} pods but up() asked for {hosts}; "
                         "set one of them (KubernetesSpec(hosts=None) takes up()'s)")
    if spec.gpus_per_host and procs > spec.gpus_per_host:
        raise ValueError(f"procs: {procs} processes per host but each pod asks for {spec.gpus_per_host} "
                         f"GPUs; raise gpus_per_host to {procs} or lower procs")
    return dataclasses.replace(spec, hosts=hosts).validate()


def selector_labels(spec: KubernetesSpec) -> dict[str, str]:
    """Labels worker pods carry and KubernetesJob selects on (the same dict, so they cannot drift)."""
    if spec.label_selector is not None:
        parsed = _parse_selector(spec.label_selector)
        if parsed is None:
            raise ValueError(f"label_selector: {spec.label_selector!r} is not 'key=value[,key=value]'")
        return parsed
    return {APP_LABEL: APP_VALUE, MESH_LABEL: spec.mesh}


def label_selector(spec: KubernetesSpec) -> str:
    return ",".join(f"{key}={value}" for key, value in selector_labels(spec).items())


def resources(spec: KubernetesSpec) -> dict[str, str]:
    """Per-pod resources, used as both requests and limits (Monarch's ImageSpec does the same)."""
    wanted = {spec.gpu_resource: str(spec.gpus_per_host) if spec.gpus_per_host else None,
              "cpu": spec.cpu, "memory": spec.memory}
    return {name: value for name, value in wanted.items() if value is not None}


@dataclass(frozen=True)
class JobArguments:
    """Keyword arguments for ``KubernetesJob(**init)`` and ``job.add_mesh(**add_mesh)``, as plain data.

    ``init["kubeconfig"]`` is a path (or None) and ``image_spec`` holds ``ImageSpec`` keywords:
    ``make_kubernetes_job`` turns them into Monarch's ``KubeConfig`` and ``ImageSpec`` objects.
    """

    init: dict[str, Any]
    add_mesh: dict[str, Any]
    image_spec: dict[str, Any] | None


def kubernetes_job_arguments(spec: KubernetesSpec) -> JobArguments:
    """The spec as KubernetesJob's own argument names (the tests hold them to Monarch's source)."""
    spec.validate()
    if spec.hosts is None:
        raise ValueError("hosts: unset; pass Session.up(hosts=...) or KubernetesSpec(hosts=N)")
    init = {"namespace": spec.namespace, "timeout": spec.timeout_s,
            "kubeconfig": spec.kubeconfig, "attach_to": spec.attach_to}
    add_mesh: dict[str, Any] = {"name": spec.mesh, "num_replicas": spec.hosts, "port": spec.port}
    if spec.mode == "attach":
        # Explicit, so the selector is the one our manifests label pods with, not Monarch's default.
        add_mesh.update(label_selector=label_selector(spec), pod_rank_label=spec.pod_rank_label)
        return JobArguments(init, add_mesh, None)
    if spec.labels:
        add_mesh["labels"] = dict(spec.labels)
    image_spec = {"image": spec.image, "resources": resources(spec) or None,
                  "shared_memory_size": spec.shared_memory}
    return JobArguments(init, add_mesh, image_spec)


def make_kubernetes_job(spec: KubernetesSpec, direct_configuration: Any = None) -> Any:
    """Build Monarch's ``KubernetesJob`` (not applied yet; ``job.state(cached_path=None)`` connects).

    Importing Monarch's module needs the ``kubernetes`` package; constructing the job sets
    Monarch's process-wide default transport to TcpWithHostname. ``direct_configuration``: the
    API's client configuration for a kernel outside the cluster that reaches pod IPs itself.
    """
    args = kubernetes_job_arguments(spec)
    try:
        importlib.import_module("kubernetes")
        k8s = importlib.import_module("monarch.job.kubernetes")
    except (ImportError, RuntimeError) as exc:  # Monarch turns the ImportError into a RuntimeError
        if isinstance(exc, RuntimeError) and "kubernetes" not in str(exc):
            raise
        raise KubernetesUnavailableError(
            "kubernetes: Monarch's KubernetesJob needs the `kubernetes` Python package to talk to the "
            "API server, and it is not installed; run `pip install kubernetes` in the notebook kernel's "
            "environment (worker pods do not need it)") from exc
    init = dict(args.init)
    if direct_configuration is not None:  # this kernel dials pod IPs itself (see seam_cluster)
        from .. import seam_cluster

        init["kubeconfig"] = seam_cluster.kubernetes_direct_config(direct_configuration)
    elif init["kubeconfig"] is not None:
        init["kubeconfig"] = k8s.KubeConfig.from_path(init["kubeconfig"])
    job = k8s.KubernetesJob(**init)
    add_mesh = dict(args.add_mesh)
    if args.image_spec is not None:
        add_mesh["image_spec"] = k8s.ImageSpec(**args.image_spec)
    job.add_mesh(**add_mesh)
    return job


def manifests(spec: KubernetesSpec) -> list[dict[str, Any]]:
    """What a user applies before ``Session.up``: RBAC for the kernel, plus the workers in attach mode."""
    spec.validate()
    if spec.mode == "attach" and spec.hosts is None:
        raise ValueError("hosts: unset; the StatefulSet needs a replica count (KubernetesSpec(hosts=N))")
    if spec.mode == "attach" and spec.pod_rank_label != POD_INDEX_LABEL:
        raise ValueError(f"pod_rank_label: a StatefulSet ranks its pods with {POD_INDEX_LABEL}; with another "
                         "rank label (e.g. Volcano's volcano.sh/task-index) create the pods yourself")
    docs = [_namespace(spec), *_rbac(spec)]
    if spec.mode == "attach":
        docs += pod_set(spec)
    return docs


def pod_set(spec: KubernetesSpec) -> list[dict[str, Any]]:
    """One mesh's pod set: its headless Service, StatefulSet and PodDisruptionBudget."""
    return [_service(spec), _stateful_set(spec), _disruption_budget(spec)]


def manifest_text(spec: KubernetesSpec) -> str:
    header = [
        f"# Generated by monarch_nb.jobs.kubernetes for {_spec_repr(spec)}.",
        "# Regenerate instead of editing: python -m monarch_nb.jobs.kubernetes --help",
        "# Steps on a real cluster: deploy/kubernetes/README.md",
    ]
    return "\n".join(header) + "\n" + render_yaml(manifests(spec))


def render_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Multi-document YAML (PyYAML), keys in the order written, multi-line strings as blocks."""
    return yaml.dump_all([dict(doc) for doc in docs], Dumper=_ManifestDumper, explicit_start=True,
                         sort_keys=False, default_flow_style=False, width=120)


class _ManifestDumper(yaml.SafeDumper):
    """SafeDumper that writes a multi-line string (the worker script) as a literal block and
    repeats a shared mapping (selector labels) instead of writing YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _str_representer)


# --- manifest pieces -------------------------------------------------------------------------

def _meta(spec: KubernetesSpec, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, **extra}


def _namespace(spec: KubernetesSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace}}


def _rbac(spec: KubernetesSpec) -> list[dict[str, Any]]:
    # KubernetesJob watches pods in both modes; in operator mode it also gets, creates, patches
    # (when one exists) and deletes (kill) MonarchMesh resources.
    rules: list[dict[str, Any]] = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    if spec.mode == "operator":
        rules.append({"apiGroups": ["monarch.pytorch.org"], "resources": ["monarchmeshes"],
                      "verbs": ["get", "list", "watch", "create", "patch", "delete"]})
    name = spec.service_account
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, name)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(spec, name),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(spec, name),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def _service(spec: KubernetesSpec) -> dict[str, Any]:
    # Headless: a StatefulSet needs a governing Service; KubernetesJob itself dials pod IPs.
    labels = selector_labels(spec)
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec, f"{spec.mesh}-svc", labels=labels),
            "spec": {"clusterIP": "None", "selector": labels,
                     "ports": [{"name": "monarch", "port": spec.port}]}}


DRAIN_GRACE_S = 120  # how long an evicted worker's pod serves on: a group's move onto a fresh pod set must fit


def _disruption_budget(spec: KubernetesSpec) -> dict[str, Any]:
    """At most one host of a mesh may be disrupted voluntarily at a time (a drain, an eviction):
    the run replaces it while the others keep training."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(spec, spec.mesh, labels=selector_labels(spec)),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(spec)}}}


def _expected_versions() -> str:
    return " ".join(f"{dist}=={metadata.version(dist)}" for dist in ("torchmonarch", "monarch_nb"))


def _stateful_set(spec: KubernetesSpec) -> dict[str, Any]:
    labels = selector_labels(spec)
    env: list[dict[str, Any]] = [
        {"name": "MONARCH_PORT", "value": str(spec.port)},  # KubernetesJob reads the port from this value
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},  # where it runs, for people
        {"name": "MONARCH_NB_VERSIONS", "value": _expected_versions()},
    ]
    env += [{"name": k, "value": v} for k, v in {**WORKER_ENV, **spec.env}.items()]
    container: dict[str, Any] = {
        "name": "worker", "image": spec.image,
        "command": [spec.python, "-u", "-c", WORKER_SCRIPT],
        "imagePullPolicy": spec.image_pull_policy,
        **({"workingDir": spec.working_dir} if spec.working_dir else {}),
        "env": env,
        "ports": [{"name": "monarch", "containerPort": spec.port}],
        # KubernetesJob waits for Ready pods: ready means the worker is listening.
        "readinessProbe": {"tcpSocket": {"port": "monarch"}, "periodSeconds": 2},
    }
    if resources(spec):
        container["resources"] = {"requests": resources(spec), "limits": resources(spec)}
    # A planned eviction (``kubectl drain``) that names no grace period gets DRAIN_GRACE_S, the
    # worker serving on through it (the preStop sleep): the run moves its group to another node
    # first (ft/control/node_drains.py). The run's own stops delete pods with no grace period.
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": DRAIN_GRACE_S - 5}}}
    # Workers never call the API server, and anyone who reaches their port can run code on them.
    pod: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container],
                           "terminationGracePeriodSeconds": DRAIN_GRACE_S}
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    # Spread over the nodes where it can (a node lost then takes as few hosts as it can): a mesh's
    # pods, or with ``labels`` every pod carrying them (a run's groups and spares, one pod set each).
    pod["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                         "whenUnsatisfiable": "ScheduleAnyway",
                                         "labelSelector": {"matchLabels": dict(spec.labels) or labels}}]
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if spec.shared_memory is not None:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shared_memory}})
    host_mounts, host_volumes = host_path_volumes(spec.host_paths, spec.writable_paths)
    mounts += host_mounts
    volumes += host_volumes
    if mounts:
        container["volumeMounts"] = mounts
        pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(spec, spec.mesh, labels={**labels, **spec.labels}),
        "spec": {"serviceName": f"{spec.mesh}-svc", "replicas": spec.hosts,
                 "podManagementPolicy": "Parallel",  # all hosts start at once, not one by one
                 "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": {**labels, **spec.labels}}, "spec": pod}},
    }


def host_path_volumes(read_only: Sequence[str], writable: Sequence[str]) -> tuple[list[dict], list[dict]]:
    """Mounts and volumes of this machine's directories, each at the same path in the pod."""
    paths = {p: True for p in read_only}
    paths.update((p, False) for p in writable)  # a path named both ways is writable
    mounts = [{"name": f"host{i}", "mountPath": path, "readOnly": ro} for i, (path, ro) in enumerate(paths.items())]
    volumes = [{"name": f"host{i}", "hostPath": {"path": path, "type": "Directory"}} for i, path in enumerate(paths)]
    return mounts, volumes


# --- small helpers ---------------------------------------------------------------------------

def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return _int(value) and value > 0  # type: ignore[operator]


def _fits(pattern: re.Pattern[str], value: object, max_len: int = 253) -> bool:
    return isinstance(value, str) and len(value) <= max_len and pattern.fullmatch(value) is not None


def _parse_selector(text: str) -> dict[str, str] | None:
    pairs = [part.split("=") for part in text.split(",")] if isinstance(text, str) else []
    if not pairs or any(len(p) != 2 or not _fits(_LABEL_KEY, p[0].strip(), 316)
                        or not _fits(_LABEL_VALUE, p[1].strip(), 63) for p in pairs):
        return None
    return {key.strip(): value.strip() for key, value in pairs}


def _spec_repr(spec: KubernetesSpec) -> str:
    default = KubernetesSpec()
    changed = [f"{f.name}={getattr(spec, f.name)!r}" for f in dataclasses.fields(spec)
               if getattr(spec, f.name) != getattr(default, f.name)]
    return f"KubernetesSpec({', '.join(changed)})"


# --- command line ----------------------------------------------------------------------------

def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag}: {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the manifests for a spec: ``python -m monarch_nb.jobs.kubernetes --hosts 4 | kubectl apply -f -``."""
    d = KubernetesSpec()
    p = argparse.ArgumentParser(prog="python -m monarch_nb.jobs.kubernetes", description=main.__doc__)
    p.add_argument("--mode", choices=MODES, default=d.mode)
    p.add_argument("--hosts", type=int, default=2, help="pods (default: 2)")
    p.add_argument("--image", default=d.image)
    p.add_argument("--namespace", default=d.namespace)
    p.add_argument("--mesh", default=d.mesh)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--gpus", type=int, default=d.gpus_per_host, help="GPUs per pod")
    p.add_argument("--gpu-resource", default=d.gpu_resource)
    p.add_argument("--cpu", default=d.cpu)
    p.add_argument("--memory", default=d.memory)
    p.add_argument("--shm", default=d.shared_memory, help="memory-backed /dev/shm size, e.g. 16Gi")
    p.add_argument("--service-account", default=d.service_account)
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="worker env (attach mode)")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="StatefulSet/MonarchMesh label")
    a = p.parse_args(argv)
    spec = KubernetesSpec(
        image=a.image, namespace=a.namespace, mesh=a.mesh, hosts=a.hosts, mode=a.mode, port=a.port,
        gpus_per_host=a.gpus, gpu_resource=a.gpu_resource, cpu=a.cpu, memory=a.memory,
        shared_memory=a.shm, env=_pairs(a.env, "--env"), labels=_pairs(a.label, "--label"),
        service_account=a.service_account)
    try:
        sys.stdout.write(manifest_text(spec))
    except ValueError as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
