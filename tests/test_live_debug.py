"""The client of Monarch's debugger protocol against a server that speaks it (the real one runs
in tests/test_kernel_interactive.py): one line per command, output read up to the next prompt."""

from __future__ import annotations

import socket
import threading

from monarch_nb.live_debug import LiveDebugger, drive

REPLIES = {"list": "| nb_agent_main | 0 |\n", "attach nb_agent_main 0": "Attached\n> <monarch cell In [3]>(3)\n",
           "p x": "10\n", "c": "Detaching from debug session for nb_agent_main 0\n"}


def serve(sock: socket.socket, seen: list[str]) -> None:
    conn, _ = sock.accept()
    with conn, conn.makefile("rwb", buffering=0) as f:
        f.write(b"\n*** MONARCH DEBUGGER ***\n")
        f.write(b"monarch_dbg> ")  # a prompt may come in a write of its own
        attached = False
        for raw in f:
            line = raw.decode().rstrip("\n")
            seen.append(line)
            if line == "quit":
                return
            attached = line.startswith("attach") or (attached and line != "c")
            f.write(REPLIES.get(line, "").encode())
            f.write(b"(Pdb) " if attached else b"monarch_dbg> ")


def test_commands_run_in_order_each_read_up_to_its_prompt_and_quit_leaves_ranks_stopped():
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []
    thread = threading.Thread(target=serve, args=(server, seen), daemon=True)
    thread.start()
    shown: list[str] = []
    with LiveDebugger(server.getsockname()) as dbg:
        assert dbg.prompt == "monarch_dbg> "
        assert dbg.send("list") == REPLIES["list"] and dbg.prompt == "monarch_dbg> "
        finished = drive(dbg, ["attach nb_agent_main 0", "p x", "c"], read=None, show=shown.append,
                         done=lambda: len(seen) >= 4)
    thread.join(5)
    server.close()
    assert finished
    assert shown[:3] == ["monarch_dbg> attach nb_agent_main 0", "Attached\n> <monarch cell In [3]>(3)", "(Pdb) p x"]
    assert "10" in shown and shown[-1].startswith("Detaching")
    assert seen == ["list", "attach nb_agent_main 0", "p x", "c", "quit"]  # close() sends quit
    # from the input box: quit ends at once, saying the ranks may still be stopped
    assert drive(dbg, None, read=lambda prompt: "quit", show=shown.append) is False
