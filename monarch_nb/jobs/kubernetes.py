"""Kubernetes placement: a ``KubernetesSpec`` becomes Monarch's ``KubernetesJob`` and the manifests to apply.

Monarch 0.7.0's ``KubernetesJob`` has two modes and both map from one spec: ``"attach"`` (default)
finds pods you created by label, and we generate those pods (a StatefulSet); ``"operator"`` makes
KubernetesJob create ``MonarchMesh`` resources that monarch-operator 0.2.x (installed separately,
Helm) turns into pods, so we generate only the controller's RBAC. Manifests are plain dicts,
written as YAML by a small emitter (no PyYAML needed).
Tested without a cluster: validation, the mapping onto KubernetesJob's real argument names,
generated manifests and the shipped examples. Never run against a Kubernetes API server: none
is reachable from this project's machines, so this path is unverified on a real cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal, Mapping, Sequence

from monarch_nb.errors import MonarchNbError

from . import Allocation

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
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)  # on the StatefulSet / MonarchMesh (e.g. Kueue)
    label_selector: str | None = None  # attach only: "k=v,k2=v2"; default selects our StatefulSet
    pod_rank_label: str = POD_INDEX_LABEL  # attach only: pod label holding the host rank
    service_account: str = "monarch-controller"  # the notebook kernel pod's account (RBAC)
    timeout_s: int | None = 600  # KubernetesJob: seconds to wait for ready pods; None = forever
    kubeconfig: str | None = None  # path, for a kernel outside the cluster; None = in-cluster
    attach_to: str | None = None  # "tcp://127.0.0.1:PORT" of your own port-forward to a worker

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


def make_kubernetes_job(spec: KubernetesSpec) -> Any:
    """Build Monarch's ``KubernetesJob`` (not applied yet; ``job.state(cached_path=None)`` connects).

    Importing Monarch's module needs the ``kubernetes`` package; constructing the job sets
    Monarch's process-wide default transport to TcpWithHostname.
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
    if init["kubeconfig"] is not None:
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
        docs += [_service(spec), _stateful_set(spec)]
    return docs


def manifest_text(spec: KubernetesSpec) -> str:
    header = [
        f"# Generated by monarch_nb.jobs.kubernetes for {_spec_repr(spec)}.",
        "# Regenerate instead of editing: python -m monarch_nb.jobs.kubernetes --help",
        "# NOT run on a Kubernetes cluster by the monarch_nb project (none is reachable where it is built).",
        "# Steps on a real cluster: deploy/kubernetes/README.md",
    ]
    return "\n".join(header) + "\n" + render_yaml(manifests(spec))


def render_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Multi-document YAML for dicts, lists, strings, ints, bools and None (all a manifest needs)."""
    return "".join("---\n" + "\n".join(_emit(doc, 0)) + "\n" for doc in docs)


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


def _expected_versions() -> str:
    return " ".join(f"{dist}=={metadata.version(dist)}" for dist in ("torchmonarch", "monarch_nb"))


def _stateful_set(spec: KubernetesSpec) -> dict[str, Any]:
    labels = selector_labels(spec)
    env: list[dict[str, Any]] = [
        {"name": "MONARCH_PORT", "value": str(spec.port)},  # KubernetesJob reads the port from this value
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MONARCH_NB_VERSIONS", "value": _expected_versions()},
    ]
    env += [{"name": k, "value": v} for k, v in {**WORKER_ENV, **spec.env}.items()]
    container: dict[str, Any] = {
        "name": "worker", "image": spec.image,
        "command": ["python", "-u", "-c", WORKER_SCRIPT],
        "env": env,
        "ports": [{"name": "monarch", "containerPort": spec.port}],
        # KubernetesJob waits for Ready pods: ready means the worker is listening.
        "readinessProbe": {"tcpSocket": {"port": "monarch"}, "periodSeconds": 2},
    }
    if resources(spec):
        container["resources"] = {"requests": resources(spec), "limits": resources(spec)}
    # Workers never call the API server, and anyone who reaches their port can run code on them.
    pod: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container]}
    if spec.shared_memory is not None:
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shared_memory}}]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(spec, spec.mesh, labels={**labels, **spec.labels}),
        "spec": {"serviceName": f"{spec.mesh}-svc", "replicas": spec.hosts,
                 "podManagementPolicy": "Parallel",  # all hosts start at once, not one by one
                 "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


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


_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def _inline(value: object, indent: int) -> list[str]:
    """The text after ``key: `` or ``- ``; extra items are whole lines (block scalars)."""
    if isinstance(value, dict) and not value:
        return ["{}"]
    if isinstance(value, list) and not value:
        return ["[]"]
    if (isinstance(value, str) and "\n" in value and value.endswith("\n") and not value.endswith("\n\n")
            and not value.startswith((" ", "\n"))
            and all(line == line.rstrip() for line in value.splitlines())):
        pad = "  " * (indent + 1)
        return ["|", *[pad + line if line else "" for line in value[:-1].split("\n")]]
    return [_scalar(value)]


def _emit(value: Any, indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines += [f"{pad}{_scalar(key)}:", *_emit(item, indent + 1)]
            else:
                first, *rest = _inline(item, indent)
                lines += [f"{pad}{_scalar(key)}: {first}", *rest]
        return lines
    if isinstance(value, list):
        for item in value:
            if isinstance(item, list) and item:
                raise TypeError("render_yaml: lists of lists are not needed by any manifest")
            if isinstance(item, dict) and item:
                first, *rest = _emit(item, indent + 1)
                lines += [f"{pad}- {first.lstrip()}", *rest]
            else:
                first, *rest = _inline(item, indent)
                lines += [f"{pad}- {first}", *rest]
        return lines
    raise TypeError(f"render_yaml: a document must be a mapping, not {type(value).__name__}")


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


class KubernetesAllocation(Allocation):
    """The hosts of one mesh from Kubernetes pods, through Monarch's ``KubernetesJob``.

    Not run on a cluster by this project (none is reachable here); ``start`` is exercised with a
    simulated Monarch module only. In "attach" mode Monarch cannot delete the pods it attached
    to: ``release`` stops the connection and leaves the StatefulSet to the user.
    """

    kind = "kubernetes"
    local = False

    def __init__(self, spec: KubernetesSpec, *, hosts: int, procs: int) -> None:
        self.spec = with_shape(spec, hosts=hosts, procs=procs)
        self._job: Any = None

    def start(self) -> Any:
        self._job = make_kubernetes_job(self.spec)
        try:
            self.job_state = self._job.state(cached_path=None)
            return getattr(self.job_state, self.spec.mesh)
        except BaseException:
            self.release()
            raise

    def release(self, timeout: float = 10.0) -> None:
        job, self._job = self._job, None
        if job is None:
            return
        try:
            job.kill()
        except NotImplementedError:  # attach mode: the pods are the user's; only the connection ends
            pass
