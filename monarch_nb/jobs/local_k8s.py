"""The one-machine Kubernetes cluster of ``scripts/k8s_cluster.sh``, from Python (tests, notebooks, benchmarks).

``spec()`` is the :class:`KubernetesSpec` for it: the worker image built on this machine
(``scripts/k8s_images.sh``), the kernel's own interpreter, and this checkout with its ``.venv``
mounted read-only at the same path in every pod, so pods run exactly the kernel's torch,
torchmonarch and monarch_nb (a real cluster bakes them into its image instead). The kernel reads
the API through the ``monarch-nb`` context that ``up`` merged into the user's kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .kubernetes import KubernetesSpec

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s_cluster.sh"
CONTEXT = "monarch-nb"
IMAGE = "docker.io/monarch-nb/worker:1"
# This machine's address on node nK's pod bridge (the script's 10.244.K.1): where Monarch's client
# listens for the pods, and where the run's Lighthouse binds.
POD_GATEWAYS = tuple(f"10.244.{k}.1" for k in range(1, 10))


def kubeconfig_path() -> str:
    """The kubeconfig ``up`` merged its context into (kind's rule: $KUBECONFIG's first file, else ~/.kube/config)."""
    first = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return first or str(Path.home() / ".kube" / "config")


def code_paths() -> tuple[str, ...]:
    """Directories the worker needs from this machine: the checkout, the interpreter's environment
    (one when the venv lives in the checkout) and the interpreter the venv was made from, unless
    that is Debian's own (/usr: the worker image has the same Python 3.11 of Debian 12)."""
    paths = {str(REPO), os.path.realpath(sys.prefix)}
    base = os.path.realpath(sys.base_prefix)
    if base not in ("/usr", "/"):
        paths.add(base)
    paths = sorted(paths)
    return tuple(p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths))


def spec(**overrides: Any) -> KubernetesSpec:
    """A KubernetesSpec for the local cluster; any field may be overridden.

    Pods start where local workers would: in the kernel's directory when it is mounted, with the
    kernel's PYTHONPATH, so an actor class imported from a module beside the notebook (or a test)
    is found by the pod's worker as by a local one."""
    paths = code_paths()
    cwd = os.getcwd()
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    fields: dict[str, Any] = dict(image=IMAGE, kubeconfig=kubeconfig_path(), context=CONTEXT,
                                  python=os.path.join(sys.prefix, "bin", "python"),
                                  host_paths=paths, mount_session_dir=True, timeout_s=120, env=env,
                                  working_dir=cwd if any(cwd == p or cwd.startswith(p + os.sep) for p in paths)
                                  else None)
    fields.update(overrides)
    return KubernetesSpec(**fields).validate()


def spec_for(namespace: str | None = None, image: str | None = None, kubeconfig: str | None = None,
             context: str | None = None) -> KubernetesSpec:
    """What ``%monarch up --k8s`` asks for: this cluster's spec, unless an image, kubeconfig or
    context names another cluster (whose image must carry the kernel's code: deploy/kubernetes/)."""
    namespace = namespace or KubernetesSpec.namespace
    if image is None and kubeconfig is None and context in (None, CONTEXT):
        return spec(namespace=namespace)
    return KubernetesSpec(image=image or KubernetesSpec.image, namespace=namespace,
                          kubeconfig=kubeconfig or kubeconfig_path(), context=context).validate()


def run(action: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``scripts/k8s_cluster.sh ACTION ARGS`` (up, down, status, stop-node nK, start-node nK)."""
    return subprocess.run([str(SCRIPT), action, *args], capture_output=True, text=True, timeout=timeout)


def stop_node(node: str) -> None:
    """Stop node ``node``'s kubelet (its pods keep running; the node goes NotReady)."""
    done = run("stop-node", node, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"stop-node {node}: {done.stderr.strip()}")


def start_node(node: str) -> None:
    """Start node ``node``'s kubelet again (it kills the pods the API no longer has)."""
    done = run("start-node", node, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"start-node {node}: {done.stderr.strip()}")


def is_up() -> bool:
    return run("status", timeout=60).returncode == 0


def api() -> Any:
    """An API client for the local cluster (the ``monarch-nb`` context)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=kubeconfig_path(), context=CONTEXT)


def project_pods(namespace: str | None = None) -> list[str]:
    """Every StatefulSet and pod of monarch_nb workers, and every run host's Job and pod, on the local
    cluster ("kind/namespace/name")."""
    from kubernetes import client

    from .kubernetes import APP_LABEL, APP_VALUE
    from .kubernetes_host import HOST_LABEL

    selector = f"{APP_LABEL}={APP_VALUE}"
    with api() as a:
        core, apps, batch = client.CoreV1Api(a), client.AppsV1Api(a), client.BatchV1Api(a)
        if namespace is None:
            pods = core.list_pod_for_all_namespaces(label_selector=selector).items
            pods += core.list_pod_for_all_namespaces(label_selector=HOST_LABEL).items
            sets = apps.list_stateful_set_for_all_namespaces(label_selector=selector).items
            jobs = batch.list_job_for_all_namespaces(label_selector=HOST_LABEL).items
        else:
            pods = core.list_namespaced_pod(namespace, label_selector=selector).items
            pods += core.list_namespaced_pod(namespace, label_selector=HOST_LABEL).items
            sets = apps.list_namespaced_stateful_set(namespace, label_selector=selector).items
            jobs = batch.list_namespaced_job(namespace, label_selector=HOST_LABEL).items
    return ([f"statefulset/{s.metadata.namespace}/{s.metadata.name}" for s in sets]
            + [f"job/{j.metadata.namespace}/{j.metadata.name}" for j in jobs]
            + [f"pod/{p.metadata.namespace}/{p.metadata.name}" for p in pods])
