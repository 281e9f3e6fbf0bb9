"""The supervisor's shared state changes only under ``GroupTable.lock`` (monarch_nb/ft/control/groups.py).

Three checks, no worker process:

* the table's methods are atomic: threads hammer them with the interpreter switching threads
  every microsecond, and the values are exact (``record_step`` is a max: without the lock a
  thread writes back a step it read before another thread raised it, and the step goes back);
* no lock of the table or the supervisor is held while the supervisor calls a trainer or
  emits an event (another thread would wait on a remote call);
* no module of monarch_nb/ft assigns a group's field outside ``with self.groups.lock:``, so
  new code cannot write one unguarded again.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
import threading
import types
from pathlib import Path

import pytest

from monarch_nb.ft import RunConfig
from monarch_nb.ft.control.groups import TRAINING, WAITING, Failure, GroupTable, ReplicaGroup
from monarch_nb.ft.control.supervisor import Supervisor

THREADS, ROUNDS = 8, 2000


@pytest.fixture
def switch_often():
    """Threads switch every microsecond (default 5 ms), so a read-modify-write interleaves."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _hammer(work) -> None:
    """``work(i)`` in THREADS threads started together; re-raises the first failure."""
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("trial", range(3))
def test_concurrent_steps_keep_the_highest(switch_often, trial):
    table = GroupTable(2)
    g = table[1]
    went_back: list[tuple[int, int]] = []

    def work(i: int) -> None:
        seen = 0
        for k in range(ROUNDS):  # thread i writes i, i+8, i+16...: the highest comes last, from thread 7
            table.record_step(g, k * THREADS + i)
            now = g.step  # never below what this thread saw before: the step only moves forward
            if now < seen:
                went_back.append((seen, now))
            seen = max(seen, now)

    _hammer(work)
    assert not went_back, f"the step went back {len(went_back)} times, e.g. {went_back[:3]}"
    assert g.step == ROUNDS * THREADS - 1
    assert table[0].step == 0


def test_concurrent_attempts_are_counted_once_each(switch_often):
    # CPython 3.11 does not switch threads inside `obj.attr += 1`, so unlocked increments pass
    # this too; it holds the methods to their contract (one number per caller) on any build.
    table = GroupTable(1)
    g = table[0]
    attempts: list[int] = []
    in_a_row: list[int] = []

    def work(i: int) -> None:
        mine, row = [], []
        for _ in range(ROUNDS):
            row.append(table.failed_again(g))
            mine.append(table.begin_attempt(g))
            table.touch(g, float(i))
        attempts.extend(mine)
        in_a_row.extend(row)

    _hammer(work)
    total = THREADS * ROUNDS
    assert (g.attempts, g.in_a_row) == (total, total)
    # each caller got its own number: none was handed out twice, none skipped
    assert sorted(attempts) == list(range(1, total + 1))
    assert sorted(in_a_row) == list(range(1, total + 1))
    assert g.last_answer in {float(i) for i in range(THREADS)}


def test_rewinds_and_rejoins():
    table = GroupTable(3)
    for g, step in zip(table, (40, 25, 3)):
        table.record_step(g, step)
    table.record_step(table[0], 10)  # an older report: the step never goes back on its own
    assert [g.step for g in table] == [40, 25, 3]
    table.rewind_progress(20)  # resumed from the checkpoint of step 20
    assert [g.step for g in table] == [20, 20, 3]
    table.rewind_progress(0)  # restart from scratch
    assert [g.step for g in table] == [0, 0, 0]
    g = table[1]
    table.failed_again(g), table.failed_again(g), table.begin_attempt(g)
    table.rejoined(g)
    assert (g.in_a_row, g.attempts) == (0, 1)  # attempts count over the run, in_a_row since it last trained


# ---- no lock held across a call to a trainer or an emit -----------------------------------------


def _free(lock: threading.Lock | threading.RLock) -> bool:
    """True if another thread can take ``lock`` now (an RLock held by the caller would let the
    caller itself in again, so the probe runs in a thread of its own)."""
    got: list[bool] = []

    def probe() -> None:
        if lock.acquire(blocking=False):
            lock.release()
            got.append(True)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return bool(got)


class _Supervised:
    """A Supervisor over fakes that checks, at every trainer call and every emit, that no
    lock of the group table or the supervisor is held."""

    def __init__(self, **config: object) -> None:
        self.groups = GroupTable(2)
        self.held: list[str] = []
        self.calls: list[str] = []
        self.events: list[object] = []
        test = self

        class Endpoint:
            def __init__(self, name: str) -> None:
                self.name = name

            def _answer(self, *args: object) -> object:
                test._check(f"call {self.name}")
                test.calls.append(self.name)
                return types.SimpleNamespace(values={0: {"state": "training", "step": 7, "events": []}},
                                             errors={}, missing=[])

            gather = call = _answer

        class Actors:
            def __getattr__(self, endpoint: str) -> Endpoint:
                return Endpoint(endpoint)

        def down_many(names: list[str], **kwargs: object) -> None:
            test._check("down_many")

        session = types.SimpleNamespace(
            deadline=lambda actors, timeout: Actors(), down_many=down_many,
            up=lambda mesh, **kwargs: types.SimpleNamespace(procs=[]), spawn=lambda *args, **kwargs: Actors(),
            mesh=lambda name: types.SimpleNamespace(procs=[]))
        ingest = types.SimpleNamespace(translate=lambda replica, values: [types.SimpleNamespace(kind="rejoined")],
                                       awaiting_rejoin=lambda replica: False, expect_rejoin=lambda *args: None)
        placement = types.SimpleNamespace(up_kwargs=lambda index: {})

        def emit(event: object) -> None:
            test._check(f"emit {type(event).__name__}")
            test.events.append(event)

        self.sup = Supervisor(RunConfig(replicas=2, check_identical=False, **config), session, self.groups,
                              placement, ingest, None, types.SimpleNamespace(append=emit, recent=lambda kind: []), lambda replica: None,
                              lambda group, port: (),
                              lambda: "")

    def _check(self, what: str) -> None:
        locks = [("GroupTable.lock", self.groups.lock), ("TotalLoss._lock", self.sup.total_loss._lock)]
        if hasattr(self.sup.response, "lock"):  # on_failure="restart"
            locks.append(("RestartResponse.lock", self.sup.response.lock))
        for name, lock in locks:
            if not _free(lock):
                self.held.append(f"{name} held during {what}")


def test_no_lock_is_held_across_a_trainer_call_or_an_emit():
    s = _Supervised()
    g = s.groups[0]
    s.sup.set_state(g, WAITING)
    s.groups.failed_again(g)
    s.sup.poll(g, 1.0)  # a rejoin (in_a_row and the lost episode reset) and a step
    assert (g.in_a_row, g.step, g.state) == (0, 7, TRAINING)
    s.sup.set_state(g, WAITING)
    assert s.sup.restart_from_scratch() == [0]  # calls forget_progress, then rewinds
    assert g.step == 0 and "forget_progress" in s.calls
    assert s.events and not s.held, s.held


def test_a_restart_of_every_group_holds_no_lock_across_its_calls(monkeypatch):
    """on_failure="restart": one thread tears every group down and brings it back; it used to
    hold its lock all along (down_many, spawns, trainer calls, emits)."""
    import monarch_nb.ft.control.launcher as launcher

    monkeypatch.setattr(launcher, "_trainer_class", lambda: object)  # no monarch, no torch
    s = _Supervised(on_failure="restart")
    s.sup.respond(s.groups[0], Failure("killed", 0, 0.0, "pid"))
    assert [g.attempts for g in s.groups] == [1, 1]
    assert {"start", "poll"} <= set(s.calls) and not s.sup.response.busy()
    assert not s.held, s.held


# ---- static check: no module writes a group's field outside the lock -------------------------------

FT = Path(__file__).resolve().parents[1] / "monarch_nb" / "ft"
GROUP_FIELDS = {f.name for f in dataclasses.fields(ReplicaGroup)}
# Any write to an attribute named like a ReplicaGroup field counts as a write to a group, whatever
# the object is called (g, h, group, self.groups[i], a new name...). These objects have fields of
# the same names and are no groups; each is whitelisted where it is written, and why:
NOT_GROUPS = {
    ("spares.py", "spare"),  # a Spare: its state changes under the spare pool's own lock
    ("supervisor.py", "spare"),  # build_spare fills a Spare in before the pool marks it ready
    ("recovery.py", "rec"),  # a recovery record, built by one thread from the event log
}


def _locked(stack: list[ast.AST]) -> bool:
    """Inside ``with self.groups.lock:`` (the table's lock; not another one, such as _lost_lock)."""
    return any(isinstance(node, ast.With) and any(ast.unparse(item.context_expr).endswith("groups.lock")
                                                  for item in node.items) for node in stack)


def _group_field(target: ast.AST, module: str) -> str | None:
    """The group field ``target`` writes (``g.step``, ``self.groups[i].step``), if it writes one."""
    if not isinstance(target, ast.Attribute) or target.attr not in GROUP_FIELDS:
        return None
    if (module, ast.unparse(target.value)) in NOT_GROUPS:
        return None
    return target.attr


def unguarded_writes(source: str, filename: str = "<src>") -> list[str]:
    """Every write to a group's field outside ``with self.groups.lock:``, as "file:line field"."""
    found: list[str] = []

    def visit(node: ast.AST, stack: list[ast.AST]) -> None:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            targets = [ast.Attribute(value=node.args[0], attr=node.args[1].value)]
        flat: list[ast.AST] = []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            else:
                flat.append(t)
        for t in flat:
            name = _group_field(t, filename)
            if name is not None and not _locked(stack):
                found.append(f"{filename}:{node.lineno} {name}")
        # a function's body runs when it is called, not under a lock around its definition
        inner = [] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else stack + [node]
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), [])
    return found


def _modules() -> list[Path]:
    # groups.py is the table itself: its methods are where the writes live, each under the lock.
    return sorted(p for p in FT.glob("*.py") if p.name != "groups.py")


def test_no_module_writes_a_group_field_outside_the_lock():
    found = [w for p in _modules() for w in unguarded_writes(p.read_text(), p.name)]
    assert not found, ("a replica group's field written outside GroupTable.lock; add a GroupTable "
                       f"method that writes it under the lock: {found}")


def test_the_static_check_finds_the_old_writes():
    old = (
        "def poll(self, g, result):\n"
        "    g.step = max(g.step, result)\n"
        "    h.attempts += 1\n"
        "    group.last_answer, group.procs = 0.0, []\n"
        "    self.groups[0].in_a_row = 0\n"
        "    setattr(g, 'failure', None)\n"
        "    with self.groups.lock:\n"
        "        g.step = 0\n"  # guarded
        "        later = lambda: setattr(g, 'wake', None)\n"  # runs later, unguarded
        "    with self._lost_lock:\n"
        "        g.state = 'x'\n"  # the wrong lock
        "    spare.state, spare.actors = 'ready', None\n"  # a Spare
        "    rec.attempts = 3\n"  # a recovery record, but in supervisor.py
        "    g.name_of_something_else = 1\n")  # no group field
    assert unguarded_writes(old, "supervisor.py") == [
        "supervisor.py:2 step", "supervisor.py:3 attempts", "supervisor.py:4 procs", "supervisor.py:4 last_answer",
        "supervisor.py:5 in_a_row", "supervisor.py:6 failure", "supervisor.py:9 wake", "supervisor.py:11 state",
        "supervisor.py:13 attempts"]
