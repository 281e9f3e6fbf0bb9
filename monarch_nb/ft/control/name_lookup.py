"""Whether this host names its workers' address without asking DNS.

torch's TCPStore client looks up the name of the address it connected to, as IPv6
(``::ffff:a.b.c.d`` for IPv4), and every quorum change connects each group to the quorum's
store again. Where no line in /etc/hosts names that form, each connect asks DNS; a lost reply
costs the resolver's timeout (5 s with glibc), and the whole quorum waits for its slowest group:
at 16 groups on this box the survivors of one failure stood 5 s for it (RESULTS.md, the
recovery ladder). The run says so at its start, with the line that fixes it (a name of its own:
the name "localhost" on that line would make "localhost" resolve to the mapped form as well).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time


def store_form(address: str) -> str:
    """The form torch's store client looks up: an IPv4 address as IPv6-mapped."""
    ip = ipaddress.ip_address(address)
    return f"::ffff:{ip}" if ip.version == 4 else str(ip)


def reverse_lookup_finding(address: str, timeout_s: float = 1.0) -> str | None:
    """None when ``address``'s store form is named within ``timeout_s``; else one sentence
    naming the problem and the fix. The lookup runs in a daemon thread: a resolver that never
    answers costs the caller ``timeout_s``, not its own timeout."""
    form = store_form(address)
    answer: dict[str, object] = {}

    def look() -> None:
        t0 = time.monotonic()
        try:
            answer["name"] = socket.getnameinfo((form, 0), socket.NI_NAMEREQD)[0]
        except OSError as exc:
            answer["error"] = exc
        answer["seconds"] = time.monotonic() - t0

    worker = threading.Thread(target=look, name="reverse-lookup", daemon=True)
    worker.start()
    worker.join(timeout_s)
    name = "localhost-v4mapped" if address == "127.0.0.1" else "<a name of its own>"
    fix = f"add the line '{form} {name}' to /etc/hosts (./run.sh setup adds the loopback one)"
    if "seconds" not in answer:
        return (f"the name of {form} did not come within {timeout_s:g} s: torch looks it up on every "
                f"store connect, once per group at each quorum change; {fix}")
    if "error" in answer:
        return (f"{form} has no name here (so every lookup asks DNS, and a lost reply costs a quorum "
                f"change the resolver's timeout): {fix}")
    return None
