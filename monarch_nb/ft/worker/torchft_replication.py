"""The torchft side of a rank: its Manager, quorum by quorum, and what it does when a peer fails.

torchft's ``Manager`` drives every step with a quorum. ``quorum="sync"`` (the default):
``start_quorum`` forms it, and heals a recovering group, before the forward pass. ``quorum="async"``
(torchtitan's default; here opt-in, see RESULTS.md): the quorum forms in torchft's thread while
the step computes; a group that heals there adds zeros to that step's average and takes the
healed weights in ``should_commit`` (before its optimizer steps), and a donor serves its state
until its own ``should_commit``, which comes after the healing group's allreduce - so no group
steps on stale weights. Then the step averages gradients with
``Manager.allreduce`` and asks ``should_commit``. This module owns the Manager and what is
around it: the cross-replica process group, the heal transport (``heal_choice.py``), the quorum
recorder (reported as ``quorum`` and ``healed`` events), and the answers to failures that are a
peer's doing (a quorum that timed out, one whose process group could not be built): keep this
group's process and state and ask again, rebuilding the Manager only when a new quorum needs it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

from ... import seam
from ..settings.config import refuse_exposure
from .heal_choice import HealLog, choose_transport
from .rank_parts import RankParts
from .rank_state import RankState
from .replication import NoStep, Replication, StepQuorum, Waitable

if TYPE_CHECKING:
    import torch
    from torchft import Manager
    from torchft.checkpointing.transport import CheckpointTransport
    from torchft.process_group import ProcessGroup

    from .heal_transport import QuorumPeers
    from .semi_sync import SemiSync


def _replica_index(replica_id: str) -> int | None:
    """'replica_2:uuid' -> 2."""
    head = replica_id.split(":", 1)[0]
    digits = ""
    for ch in reversed(head):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None


def may_go_quiet(q: Any, group_size: int, quorum_later: bool) -> bool:
    """Whether a group leaving after this step may stop its ManagerServer (its heartbeats) now.
    The Lighthouse counts a group until its heartbeats have been silent ``heartbeat_timeout_ms``:
    a group that stopped after its last step kept the others' next quorum waiting that long;
    silenced once its last quorum formed, the window runs during its last step. Only where
    nothing else needs the server: one rank (others would still ask it), a quorum that formed
    (``quorum_later``: a meeting or an async quorum still to come), no peer told to heal from it."""
    return group_size == 1 and not quorum_later and q is not None and not list(q.recover_dst_replica_ranks)


def is_saver(q: Any, replica: int) -> bool:
    """The lowest-numbered group of the quorum saves durable checkpoints: every group knows
    the quorum, so exactly one of them saves without anyone telling it."""
    members = [_replica_index(r) for r in q.replica_ids] if q is not None else []
    members = [m for m in members if m is not None]
    return not members or replica == min(members)


class TorchftReplication(Replication):
    """Rank ``parts.rank`` of group ``replica`` under a torchft Manager that joins the
    Lighthouse at ``lighthouse``; heals load into ``state``. ``phase`` is called with the name
    of each phase of a quorum or heal this rank enters; ``emit`` takes events."""

    def __init__(self, parts: RankParts, state: RankState, *, replica: int, lighthouse: str,
                 phase: Callable[[str], None], emit: Callable[[dict[str, Any]], None]) -> None:
        self.parts, self.state, self.cfg = parts, state, parts.cfg
        self.replica, self.rank, self.lighthouse = replica, parts.rank, lighthouse
        self._phase, self._emit = phase, emit
        self._comms_retries = 0
        self._retry_quorum_id: int | None = None  # the quorum whose process group could not be built
        self._last_quorum_id: int | None = None
        self._left = False  # the Manager was shut down (no heartbeat): a reset builds a new one
        self._quorum_failure: BaseException | None = None  # this step's async quorum failed (settle answers)
        # the async quorum (quorum="async") for per-step sync of one-process groups; LocalSGD / DiLoCo
        # meet synchronously, and so do FSDP groups (a heal into shards while FSDP gathers them hung)
        self.asynchronous = (self.cfg.get("quorum", "sync") == "async" and self.cfg.get("sync", "step") == "step"
                             and parts.group_size == 1)
        self.manager: Manager = self._build_manager()
        self.quorum_recorder = seam.record_quorums(self.manager)
        if self.cfg.get("sync", "step") != "step":  # LocalSGD / DiLoCo: the groups meet every few steps
            from .semi_sync import SemiSync

            self.semi = SemiSync(self.cfg, parts, self.manager)
            state.semi = self.semi

    # ---- the Manager and what it is built with --------------------------------------------------

    def _build_manager(self) -> Manager:
        import torchft

        from .heal_transport import QuorumPeers, interface_address

        timeout = timedelta(seconds=float(self.cfg.get("pg_timeout_s", 10)))
        nccl, baby = self.parts.platform.backend == "nccl", bool(self.cfg.get("pg_subprocess"))
        if baby:  # the communicator in a subprocess: an abort kills it, peers blocked on it fail at once
            from .subprocess_pg import subprocess_process_group

            pg: ProcessGroup = subprocess_process_group(nccl, timeout)
        else:
            pg = torchft.ProcessGroupNCCL(timeout=timeout) if nccl else torchft.ProcessGroupGloo(timeout=timeout)
        configure = pg.configure
        # (a Baby group's connect also starts its subprocess, a new interpreter importing torch)
        connect = timeout / 4 if not (nccl or baby) else timeout

        def configure_in_phase(store_addr: str, replica_id: str, rank: int, world_size: int,
                               *args: Any, **kwargs: Any) -> Any:  # the quorum's process group is built
            self._phase("pg_setup")
            # Connect within a quarter of the collective timeout: a member that died as the quorum
            # formed (under the async quorum, in the forward pass beside this build) never
            # connects, and the others find out in that time, not in a whole pg_timeout_s.
            pg.set_timeout(connect)
            try:
                out = configure(store_addr, replica_id, rank, world_size, *args, **kwargs)
            finally:
                pg.set_timeout(timeout)
            if connect != timeout:
                seam.set_collective_timeout(pg, timeout)
            self._heal_peers.join(store_addr, rank, world_size)
            return out

        pg.configure = configure_in_phase  # type: ignore[method-assign]
        self.ft_pg = pg
        self._heal_peers: QuorumPeers = QuorumPeers(timeout)
        host = heal_host = self.parts.host
        if self.cfg.get("heal_interface"):
            heal_host = interface_address(self.cfg["heal_interface"])
            refuse_exposure("heal_interface", f"{self.cfg['heal_interface']!r} (address {heal_host})", heal_host,
                            self.cfg.get("job", "local"), bool(self.cfg.get("expose")))
        self.transport: CheckpointTransport[Any] = choose_transport(
            str(self.cfg.get("heal_transport") or "striped"), heal_host, pg, timeout, device=self.parts.device,
            serve=lambda: seam.manager_state_dict(self.manager)(), peers=self._heal_peers, replica=self.replica,
            streams=int(self.cfg.get("heal_streams") or 4))
        self.heals = HealLog(self.transport, self._phase, self._emit, self.replica, self.rank)
        return torchft.Manager(
            pg=pg,
            load_state_dict=self.state.load_state_dict,
            state_dict=self.state.state_dict,
            min_replica_size=int(self.cfg.get("min_replicas", 1)),
            use_async_quorum=self.asynchronous,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=float(self.cfg.get("quorum_timeout_s", 10))),
            connect_timeout=timedelta(seconds=30),
            rank=self.rank,
            world_size=self.parts.group_size,
            store_addr=self.parts.store_host,
            store_port=self.parts.store_port,
            lighthouse_addr=self.lighthouse,
            replica_id=f"replica_{self.replica}",
            hostname=host,
            heartbeat_interval=timedelta(milliseconds=100),
            checkpoint_transport=self.transport,
            init_sync=False,  # every replica starts from the same seed; hashes prove it
        )

    def _new_manager(self, after_timeout: bool = False) -> None:
        """A fresh torchft Manager with this replica's step: after a quorum request timed out,
        torchft 0.2.0's Manager fails every later request at once (seen when the Lighthouse died
        and came back on the same address), while model, optimizer and step are all intact
        here. The new Manager joins the next quorum of a restarted Lighthouse as the same step,
        so no group loses its state or restarts."""
        state = self.manager.state_dict()
        if after_timeout:  # its quorum request may still count at the Lighthouse (seam.retire_manager)
            seam.retire_manager(self.manager, timedelta(milliseconds=int(self.cfg.get("heartbeat_timeout_ms", 1000))))
        else:  # it got its quorum: nothing of it waits at the Lighthouse
            try:
                seam.shutdown_manager(self.manager)
            except Exception:  # noqa: BLE001
                pass
        self.manager = self._build_manager()
        self._left = False
        self.manager.load_state_dict(state)
        self.quorum_recorder = seam.record_quorums(self.manager)
        self._last_quorum_id = None

    # ---- a step's quorum ------------------------------------------------------------------------

    def start(self, last_commit: tuple[int, float] | None) -> StepQuorum | NoStep:
        if self.asynchronous:
            return self._start_async()
        try:
            self.manager.start_quorum()
        except TimeoutError as exc:
            return self._quorum_timed_out(exc)
        except Exception as exc:  # noqa: BLE001 - the quorum machinery failed: a peer's doing
            return self._comms_retry(f"the quorum failed: {type(exc).__name__}: {exc}", rebuild=True,
                                     request_may_linger=True)
        if self._last_quorum_id is not None and seam.process_group_is_down(self.ft_pg):
            # The quorum formed, but building its process group failed: a member died while we
            # connected to it (a store key that never came, a gloo connect timeout). Our state
            # and step are intact; a peer's death is not our fault. The next quorum, without the
            # dead member, has a new id and torchft builds a new group for it; only when the same
            # quorum comes back (nobody left it) is our Manager rebuilt to force a new one.
            q = self.quorum_recorder.last
            qid = q.quorum_id if q is not None else None
            same, self._retry_quorum_id = qid is not None and qid == self._retry_quorum_id, qid
            return self._comms_retry(self._pg_error() or "the cross-replica process group could not be built",
                                     rebuild=same)
        self._comms_retries, self._retry_quorum_id = 0, None
        self.offer()
        return self.formed(last_commit)

    def _quorum_timed_out(self, exc: BaseException) -> NoStep:
        """No quorum in quorum_timeout_s: the Lighthouse is gone (a request in flight to a
        Lighthouse that died never completes) or too few groups are alive. Not this group's
        failure: report it and ask again with a new Manager - a restarted Lighthouse answers."""
        self._emit({"kind": "quorum_timeout", "replica": self.replica, "rank": self.rank,
                    "error": str(exc)[:200], "t": time.time()})
        self._new_manager(after_timeout=True)
        return NoStep({"kind": "quorum_timeout", "step": self.manager.current_step(), "committed": False},
                      manager_replaced=True)

    def _await_quorum(self) -> None:
        """Wait for this step's async quorum. Its own failure (a timeout: the Lighthouse is gone)
        is torchft's error for the step, answered in :meth:`settle` as the sync quorum answers it."""
        if self._quorum_failure is None:
            try:
                self.manager.wait_quorum()
            except Exception as exc:  # noqa: BLE001 - the quorum machinery failed: not our fault
                self._quorum_failure = exc
                self.manager.report_error(exc)

    def _answer_quorum_failure(self) -> NoStep | None:
        """The async quorum's own failure, if one is pending, answered as the sync quorum answers
        it: a timeout with a new Manager, anything else with a retry."""
        failure, self._quorum_failure = self._quorum_failure, None
        if failure is None:
            return None
        if isinstance(failure, TimeoutError):
            return self._quorum_timed_out(failure)
        return self._comms_retry(f"the quorum failed: {type(failure).__name__}: {failure}", rebuild=True,
                                 request_may_linger=True)

    def _start_async(self) -> StepQuorum | NoStep:
        """torchft's async quorum: started here, formed while the step computes (``settle``). A
        failure seen while catching up (a step that then waited instead of settling) is answered first."""
        answered = self._answer_quorum_failure()
        if answered is not None:
            return answered
        try:
            self.manager.start_quorum()
        except Exception as exc:  # noqa: BLE001 - the quorum machinery failed: a peer's doing
            return self._comms_retry(f"the quorum failed: {type(exc).__name__}: {exc}", rebuild=True,
                                     request_may_linger=True)
        self.offer()
        return StepQuorum(0, self._last_quorum_id, healed=False, saver=False, pending=True)

    def settle(self, quorum: StepQuorum, last_commit: tuple[int, float] | None) -> StepQuorum:
        if not quorum.pending:
            return quorum
        if self._answer_quorum_failure() is not None:  # the quorum itself failed (the step did not commit)
            return StepQuorum(0, self._last_quorum_id, healed=False, saver=False)
        if seam.process_group_is_down(self.ft_pg) or self.manager.errored() is not None:
            # A peer died in this step's quorum, its process group or its allreduce: not our
            # fault, and the step did not commit. Keep the process and retry; the next quorum (a
            # new id without the dead member) builds a fresh group, and a quorum that comes back
            # the same rebuilds our Manager first, as under the synchronous quorum.
            q = self.quorum_recorder.last
            qid = q.quorum_id if q is not None else None
            same, self._retry_quorum_id = qid is not None and qid == self._retry_quorum_id, qid
            formed = self.formed(last_commit)
            err = self.manager.errored()
            cause = getattr(err, "original_exception", err)
            self._comms_retry(f"the step's cross-replica communication broke: {type(cause).__name__}: {cause}",
                              rebuild=same, backoff=same)  # no pause unless the same quorum came back
            return formed
        self._retry_quorum_id, self._comms_retries = None, 0
        return self.formed(last_commit)

    def catch_up(self) -> None:
        if self.asynchronous:
            self._await_quorum()

    def offer(self) -> None:
        """Serve this group's state to a peer that may heal at this step's quorum (the per-step
        quorum's, or a semi-synchronous meeting's)."""
        offer = getattr(self.transport, "offer", None)
        if offer is not None and self.manager.errored() is None:
            # Any member of the quorum may serve a peer that heals at this step (a striped heal
            # fetches from all of them); torchft itself offers only on the donor it picked.
            offer(self.manager.current_step(), seam.manager_state_dict(self.manager))  # read only if asked

    def formed(self, last_commit: tuple[int, float] | None) -> StepQuorum:
        """The quorum this step (or a semi-synchronous meeting) trains in, once formed: reported
        (``quorum``, ``healed``)."""
        q = self.quorum_recorder.last
        participants = self.manager.num_participants()
        if q is not None and q.quorum_id != self._last_quorum_id:
            self._last_quorum_id = q.quorum_id
            members = [_replica_index(r) for r in q.replica_ids]
            # The quorum's store (which every member's process group connects through) is one
            # member's group store: "store" names it, "own_store" is ours, so the controller can
            # tell whose node a quorum depends on.
            self._emit({"kind": "quorum", "quorum_id": int(q.quorum_id), "participants": members,
                        "store": str(q.store_address),
                        "own_store": f"{self.parts.store_host}:{self.parts.store_port}",
                        "replica": self.replica, "rank": self.rank, "t": time.time()})
        healed = self._report_heal(q, last_commit)  # q: torchft's QuorumResult (its private _torchft)
        return StepQuorum(participants, self._last_quorum_id, healed, is_saver(q, self.replica))

    def _report_heal(self, q: Any, last_commit: tuple[int, float] | None) -> bool:
        """The ``healed`` event, when this quorum healed us; True if it did."""
        info = self.state.take_healed()
        if info is None:
            return False
        recv = self.heals.take() or {}
        src = None
        if q is not None and q.recover_src_replica_rank is not None:
            ids = list(q.replica_ids)
            if 0 <= q.recover_src_replica_rank < len(ids):
                src = _replica_index(ids[q.recover_src_replica_rank])
        # Where we were before the heal: a group that was never failed heals because quorums
        # went on without it (on a starved host its heartbeats or its quorum request came late).
        last_step, last_t = last_commit or (None, None)
        self._emit({"kind": "healed", "replica": self.replica, "rank": self.rank,
                    "step": self.manager.current_step(), "bytes": info["bytes"],
                    "seconds": recv.get("seconds", 0.0) + info["apply_seconds"], "apply_s": info["apply_seconds"],
                    "source_replica": src, "from_step": last_step, **recv.get("striped", {}),
                    "unheard_s": None if last_t is None else time.time() - last_t, "t": time.time()})
        return True

    def _comms_retry(self, reason: str, rebuild: bool, request_may_linger: bool = False,
                     backoff: bool = True) -> NoStep:
        """Cross-replica communication broke through no fault of ours (a peer died during the
        quorum or while its process group was built). Keep the process, model, optimizer and
        step, and try the next quorum. ``rebuild``: first rebuild the torchft Manager in place
        (a new replica id, so the next quorum is a new one with a freshly built process group)
        - only when needed, since a new member makes every peer rebuild its group too. Backs
        off while it keeps failing, so a long outage is not a tight loop."""
        self._comms_retries += 1
        self._emit({"kind": "comms_retry", "replica": self.replica, "rank": self.rank, "reason": reason[:300],
                    "attempt": self._comms_retries, "rebuilt": rebuild, "step": self.manager.current_step(),
                    "t": time.time()})
        if rebuild:  # a quorum that never formed may leave its request at the Lighthouse
            self._new_manager(after_timeout=request_may_linger)
        if backoff:
            time.sleep(min(0.1 * 2 ** min(self._comms_retries - 1, 5), 2.0))
        return NoStep({"kind": "comms_retry", "step": self.manager.current_step(), "committed": False},
                      manager_replaced=rebuild)

    def _pg_error(self) -> str | None:
        err = self.manager.errored()
        return f"the process group of the new quorum could not be built: {type(err.original_exception).__name__}: " \
               f"{err.original_exception}" if err is not None and hasattr(err, "original_exception") else None

    # ---- the Manager calls the step makes ---------------------------------------------------------

    def current_step(self) -> int:
        return self.manager.current_step()

    def restore_step(self, step: int) -> None:
        if self.semi is not None:  # the Manager counts meetings there
            self.semi.restore(step)
            return
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    def allreduce(self, tensor: torch.Tensor) -> Waitable:
        if self.asynchronous:
            self._await_quorum()  # failed: torchft's allreduce of an errored step does nothing
        return self.manager.allreduce(tensor)

    def errored(self) -> BaseException | None:
        return self.manager.errored()

    def should_commit(self) -> bool:
        if self._quorum_failure is not None:  # no quorum formed (torchft's own would raise it again)
            return False
        return self.manager.should_commit()

    def abort(self) -> None:
        self.ft_pg.abort()

    def reset(self, failed_collective: bool = False) -> bool:
        """A fresh process group at the next quorum, this replica's step kept. After a failed
        collective torchft's own error path does it: the Manager counted a commit failure, the
        Lighthouse gives the next quorum a new id for it, and torchft reconfigures the group -
        with us still a member (the same replica id, heartbeating throughout), so the others
        neither drop us nor take us back one quorum later, and nobody heals. Otherwise (a step
        that raised before its commit) a new Manager: its new replica id makes the next quorum a
        new one."""
        if self.semi is not None:
            self._comms_retries, self._retry_quorum_id = 0, None
            return self.semi.reset_communicator(left=self._left)
        kept = failed_collective and not self._left and seam.commit_failures(self.manager) > 0
        if not kept:
            self._new_manager()
        self._comms_retries, self._retry_quorum_id = 0, None
        return kept

    def go_quiet(self) -> bool:
        """torchft has no leave call: silent from this step's quorum on (see ``may_go_quiet``)."""
        late = self.semi is not None or self.asynchronous
        return may_go_quiet(self.quorum_recorder.last, self.parts.group_size, late) and seam.silence_manager(self.manager)

    def shutdown(self) -> None:
        self._left = True
        if self.semi is not None:
            self.semi.close()
        try:
            seam.shutdown_manager(self.manager)
        except Exception:
            pass

    def ports(self) -> dict[str, int | None]:
        http = seam.http_transport_port(self.transport) if hasattr(self.transport, "_server") else None
        return {"torchft manager server": seam.manager_server_port(self.manager), "checkpoint server": http}
