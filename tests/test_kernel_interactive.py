"""The interactive moves in a real Monarch kernel, as a frontend drives them: interrupting a
%%monarch cell and a wait, a progress line on a long cell, an interactive post-mortem reading
the notebook's input box, and the links to the ecosystem's own views."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest

from helpers.kernel_client import run_in_kernel as run

pytestmark = pytest.mark.slow  # a real kernel and workers per test, one real training run (30 s): not in the quick lane


def execute(client, code, timeout=120, **kwargs):
    """Run ``code``; (reply content, every iopub message's (type, content))."""
    messages = []
    reply = client.execute_interactive(code, timeout=timeout,
                                       output_hook=lambda m: messages.append((m["msg_type"], m["content"])), **kwargs)
    return reply["content"], messages


def error_of(messages):
    return next(content for kind, content in messages if kind == "error")


def test_interrupting_a_sleeping_cell_ends_it_on_every_rank_within_2_s_and_the_next_cell_works(kernel):
    km, client = kernel
    status, out = run(client, "%monarch up --procs 2")
    assert status == "ok", out
    timer = threading.Timer(2.0, km.interrupt_kernel)
    timer.start()
    t0 = time.monotonic()
    reply, messages = execute(client, "%%monarch\nimport time\nt0 = time.time()\ntry:\n    time.sleep(120)\n"
                                      "finally:\n    slept = time.time() - t0")
    ended_s = time.monotonic() - t0 - 2.0  # from the interrupt
    assert reply["status"] == "error", reply
    # interrupt -> error reply: median 0.07 s, max 0.16 s (bench/bench_observability.py); 2 s is >= 10x
    assert ended_s < 2.0, f"interrupt -> error reply took {ended_s:.2f} s"
    error = error_of(messages)
    # one short line, not a traceback per layer
    assert error["ename"] == "KeyboardInterrupt" and len(error["traceback"]) == 1, error
    assert "the cell stopped on ranks [0-1]; the mesh is up for the next cell" in error["evalue"]
    shown = "".join(c.get("data", {}).get("text/plain", "") for k, c in messages if k == "display_data")
    assert shown.count("KeyboardInterrupt: stopped by the notebook at line 4: time.sleep(120)") == 2, shown
    status, out = run(client, "%%monarch\nprint(f'slept {slept:.1f}')")
    assert status == "ok" and out.count("slept ") == 2, out
    # the workers' 120 s sleep was cut short (by the interrupt ~2 s in)
    assert all(float(x.split()[0]) < 60 for x in out.split("slept ")[1:]), out


def test_a_cell_longer_than_2_s_shows_which_ranks_are_still_working(kernel):
    _, client = kernel
    run(client, "%monarch up --procs 2")
    reply, messages = execute(client, "%%monarch\nimport time\ntime.sleep(2.5 + 1.5 * rank)")
    assert reply["status"] == "ok"
    lines = [c["data"]["text/plain"] for k, c in messages if k in ("display_data", "update_display_data")
             and "ranks done" in c.get("data", {}).get("text/plain", "")]
    assert lines and "0/2 ranks done; waiting on [0-1]" in lines[0], lines
    assert any("1/2 ranks done; waiting on [1]" in line for line in lines), lines
    assert "2/2 ranks done (done in" in lines[-1], lines
    reply, messages = execute(client, "%%monarch\n1 + 1")  # a quick cell shows no progress line
    assert not [c for k, c in messages if "ranks done" in str(c)]


def test_post_mortem_reads_pdb_commands_from_the_notebook_input_box(kernel):
    _, client = kernel
    run(client, "%monarch up --procs 2")
    status, out = run(client, "%%monarch\ndef check(x):\n    if rank == 1:\n        raise ValueError(f'bad {x}')\n"
                              "check(41)")
    assert status == "error" and "ValueError: bad 41" in out
    answers = iter(["p x", "up", "l", "q"])
    prompts = []

    def stdin_hook(msg):
        prompts.append(msg["content"]["prompt"])
        client.input(next(answers))

    reply, messages = execute(client, "%monarch debug --rank 1", allow_stdin=True, stdin_hook=stdin_hook)
    text = "".join(c.get("text", "") for k, c in messages if k == "stream")
    assert reply["status"] == "ok" and prompts == ["(Pdb) "] * 4, (reply, prompts)
    assert "ValueError: bad 41" in text and "check()" in text and "\n41\n" in text
    assert "-> check(41)" in text and "def check(x):" in text
    # headless (no input box): the commands go on the line
    status, out = run(client, "%monarch debug --rank 1")
    assert status == "error" and "rank 1 has no stored exception" in out  # q ended the post-mortem


def test_interrupting_a_wait_returns_at_once_and_the_run_keeps_training(kernel):
    km, client = kernel
    status, out = run(client, "%monarch train --replicas 2 --name interrupted-wait --attached", timeout=300)
    assert status == "ok", out
    timer = threading.Timer(2.0, km.interrupt_kernel)
    timer.start()
    t0 = time.monotonic()
    reply, messages = execute(client, "%monarch wait step 100000", timeout=60)
    ended_s = time.monotonic() - t0 - 2.0  # from the interrupt
    assert reply["status"] == "error", reply
    # "at once": an interrupt ends a call in ~0.1 s (bench/bench_observability.py); 1.5 s is >= 9x
    assert ended_s < 1.5, f"interrupt -> error reply of the wait took {ended_s:.2f} s"
    error = error_of(messages)
    assert error["ename"] == "KeyboardInterrupt" and len(error["traceback"]) == 1, error
    status, out = run(client, textwrap.dedent("""
        _before = max(v["step"] for k, v in run.status().items() if isinstance(k, int))
        run.wait_for_step(_before + 2, timeout=120)
        print("STILL TRAINING", sorted(v["state"] for k, v in run.status().items() if isinstance(k, int)))
    """), timeout=180)
    assert status == "ok" and "STILL TRAINING ['training', 'training']" in out, out
    status, out = run(client, "%monarch status")
    assert status == "ok" and "torchft Lighthouse status page: http://" in out, out
    status, out = run(client, "%monarch logs --replica 1 --tail 5")
    assert status == "ok" and "[replica1 rank 0]" in out and "log files in" in out, out
    status, out = run(client, "%monarch stop")
    assert status == "ok", out


def test_breakpoints_in_a_cell_on_two_ranks_are_stepped_and_continued_from_the_notebook(kernel):
    """A live ``breakpoint()`` in a %%monarch cell stops both ranks in Monarch's own debugger; the
    cell says which rank waits where and hands the notebook that debugger: from the input box
    (JupyterLab), or from commands on the cell's line (headless). Then the cell's output comes."""
    _, client = kernel
    run(client, "%monarch up --procs 2")
    cell = "x = 10 * rank\nbreakpoint()\ny = x + 1\nprint(f'rank {rank} y={y}')"
    answers = iter(["attach nb_agent_main 1", "n", "p x, y", "c", "continue"])
    prompts = []

    def stdin_hook(msg):
        prompts.append(msg["content"]["prompt"])
        client.input(next(answers))

    reply, messages = execute(client, "%%monarch\n" + cell, timeout=180, allow_stdin=True, stdin_hook=stdin_hook)
    text = "".join(c.get("text", "") + c.get("data", {}).get("text/plain", "") for k, c in messages
                   if k in ("stream", "display_data"))
    assert reply["status"] == "ok", text
    assert "ranks [0-1] stopped at breakpoint():" in text
    assert "rank 1 (attach nb_agent_main 1): In [" in text and "line 3, in <module>: y = x + 1" in text
    assert prompts == ["monarch_dbg> ", "(Pdb) ", "(Pdb) ", "(Pdb) ", "monarch_dbg> "], prompts
    assert "(10, 11)" in text  # rank 1 stepped over `y = x + 1`
    assert "rank 0 y=1" in text and "rank 1 y=11" in text  # both ranks ran on to the end of the cell

    # headless (no input box): the commands go on the cell's line
    status, out = run(client, "%%monarch --debug 'attach nb_agent_main 0' 'p x' c continue\n" + cell, timeout=180)
    assert status == "ok", out
    assert "(Pdb) p x\n0\n" in out and "rank 0 y=1" in out and "rank 1 y=11" in out


def test_a_breakpoint_in_actor_code_is_driven_with_monarch_debug_live(kernel):
    """Monarch's own debugger on an endpoint's ``breakpoint()``: the call is in flight, and
    ``%monarch debug --live`` lists who waits where, attaches, inspects and continues."""
    _, client = kernel
    run(client, "%monarch up --procs 2")
    status, out = run(client, textwrap.dedent("""\
        import monarch_nb
        from monarch.actor import Actor, endpoint

        class Stepper(Actor):
            @endpoint
            def work(self, x: int) -> int:
                y = x * 2
                breakpoint()
                return y + 1

        in_flight = monarch_nb.current_session().spawn("steppers", Stepper).work.call(20)
        """))
    assert status == "ok", out
    status, out = run(client, "%monarch debug --live list 'attach steppers 1' 'p x, y' c continue", timeout=120)
    assert status == "ok", out
    assert out.count("| steppers ") >= 2 and "(20, 40)" in out
    status, out = run(client, "print(sorted(in_flight.get().values()))")
    assert status == "ok" and "[41, 41]" in out, out
    status, out = run(client, "%monarch debug")
    assert status == "error" and "give --rank K" in out and "--live" in out
