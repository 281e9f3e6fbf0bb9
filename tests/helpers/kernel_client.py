"""Helpers for tests that drive a real kernel through jupyter_client."""

from __future__ import annotations


def run_in_kernel(client, code, timeout=120):
    """Execute ``code`` in a real kernel; (status, everything it printed or displayed as text)."""
    outputs = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            outputs.append(msg["content"]["text"])
        elif msg["msg_type"] in ("display_data", "execute_result"):
            outputs.append(msg["content"]["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            outputs.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])

    reply = client.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"]["status"], "".join(outputs)
