"""What listens where, measured with ``ss -ltnp`` during a real local run: everything binds
loopback except what torchft 0.2.0 offers no bind address for (its Manager's own server and
torch's TCPStore), which the README lists with the reason."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

import pytest

from monarch_nb.ft import FTRun, RunConfig

pytestmark = pytest.mark.slow

NOT_BINDABLE = {"torchft manager server", "tcp store"}  # no bind option in torchft 0.2.0 / torch


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of ``pids``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        local = fields[3]
        addr, port = local.rsplit(":", 1)
        for pid in pids:
            if f"pid={pid}," in line:
                found.append((pid, addr.strip("[]"), int(port)))
    return found


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss")
def test_a_local_run_listens_on_loopback_except_what_torchft_cannot_bind(tmp_path):
    run = FTRun(RunConfig(replicas=2, runs_root=str(tmp_path)))
    before = set(listening({os.getpid()}))  # other tests in this process may have left servers
    try:
        run.start()
        run.wait_for_step(2, timeout=240)
        known: dict[int, str] = {}
        for g in run.groups:
            ports = run.session.deadline(g.actors, 30).listening.call()
            for _, named in ports:
                known.update({port: name for name, port in named.items() if port})
        sockets = [s for s in listening(set(run.spawned_pids) | {run.lighthouse_pid, os.getpid()})
                   if s not in before]
    finally:
        run.stop()
    assert sockets, "ss saw no listening socket of the run"
    lighthouse = [s for s in sockets if s[0] == run.lighthouse_pid]
    assert lighthouse and all(is_loopback(a) for _, a, _ in lighthouse)
    exposed = [(pid, addr, port, known.get(port, "?")) for pid, addr, port in sockets if not is_loopback(addr)]
    assert all(name in NOT_BINDABLE for *_, name in exposed), exposed
    assert {name for *_, name in exposed} <= NOT_BINDABLE and len(exposed) <= 2 * len(run.groups.groups)
    checkpoint = [port for port, name in known.items() if name == "checkpoint server"]
    assert checkpoint and all(is_loopback(a) for _, a, p in sockets if p in checkpoint)
