"""Monarch internals for meshes on other hosts (pods, SLURM nodes with networks of their own).

Beside :mod:`monarch_nb.seam`, under the same rule: each function reaches what Monarch does not
expose (torchmonarch 0.7.0). They are checked where they are used, on the real cluster (the
Kubernetes tests) and, for the refusal, without one (tests/test_kubernetes_specs.py).
"""

from __future__ import annotations

from typing import Any


def kubernetes_direct_config(configuration: Any) -> Any:
    """Monarch's ``KubeConfig`` for a kernel that reaches pod IPs itself but reads the API through
    ``configuration`` (a ``kubernetes.client.Configuration``).

    ``KubernetesJob`` treats every kubeconfig as "out of cluster" and then attaches through a
    port-forward sidecar; a kernel on a node of the cluster (the one-machine cluster routes every
    pod subnet to this host) dials pods directly, as an in-cluster kernel does. ``out_of_cluster``
    and ``load`` are KubeConfig's public members; what they steer inside KubernetesJob is not.
    """
    import dataclasses

    from monarch.job.kubernetes import KubeConfig
    from kubernetes import client

    @dataclasses.dataclass(frozen=True)
    class _DirectKubeConfig(KubeConfig):
        @property
        def out_of_cluster(self) -> bool:
            return False

        def load(self) -> None:
            client.Configuration.set_default(self.remote)

    return _DirectKubeConfig(remote=configuration)


class ClientUnreachable(RuntimeError):
    """Monarch's client here serves an address that the workers of a cluster mesh cannot reach."""


def listen_where_workers_reach(address: str, workers: str) -> None:
    """Have Monarch's client listen on ``tcp://address`` for ``workers`` on other hosts (pods, SLURM
    nodes with networks of their own), unless it already serves a TCP address they reach."""
    import monarch.config

    if refuse_an_unreachable_client(workers) is None:
        monarch.config.configure(default_transport=f"tcp://{address}:0")


def refuse_an_unreachable_client(workers: str) -> str | None:
    """Where this process's Monarch client listens (None: it has not started). Monarch fixes a
    process's transport when its client starts (``enable_transport`` comes before any other call),
    so a client that serves a Unix socket or loopback - this process's first mesh was local - is
    refused by name at once, not after an attach waits MESH_ATTACH_CONFIG_TIMEOUT (60 s) for a
    reply that cannot come."""
    from monarch._src.actor.actor_mesh import _client_context

    client = _client_context.try_get()
    if client is None:
        return None
    serves = str(client.actor_instance.actor_id).split("@", 1)[-1]
    if serves.startswith("tcp://") and not serves.startswith(("tcp://127.", "tcp://localhost", "tcp://[::1]")):
        return serves  # a routable TCP address from an earlier cluster mesh: the workers reach it too
    raise ClientUnreachable(
        f"{workers}: Monarch's client in this process already listens on {serves}, which they cannot "
        "reach (it started with this process's first mesh, a local one, and Monarch picks its transport "
        "once per process). Restart the kernel and bring up the cluster mesh first (later local meshes "
        "share its TCP address), or train in a process of its own: `%monarch train --name N --job ...` "
        "(a named run) or FTRun.detached(...)")
