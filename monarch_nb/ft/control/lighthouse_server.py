"""The Lighthouse's own process: run by file path (``python .../lighthouse_server.py``), never as
part of the ``monarch_nb`` package, so that it imports nothing but the standard library and
torchft's compiled extension. ``import torchft`` (or ``torchft.coordination``) imports torch
first: the process held 367 MB (measured in the controller-memory issue) for a server that needs
none of torch.

Prints ``{"address": ..., "pid": ...}`` as one JSON line, then serves until its stdin closes
(the controller stopped it, or died): it can never outlive its controller.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any


def torchft_extension() -> Any:
    """torchft's ``_torchft`` extension (the Lighthouse server lives there), loaded without its
    package's ``__init__`` (which imports torch)."""
    spec = importlib.util.find_spec("torchft")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchft is not installed")
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_torchft{suffix}"
            if path.exists():
                ext = importlib.util.spec_from_file_location("torchft._torchft", path)
                assert ext is not None and ext.loader is not None
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                return module
    raise SystemExit(f"torchft's _torchft extension is not in {spec.submodule_search_locations}")


def main() -> None:
    p = argparse.ArgumentParser(description="torchft Lighthouse bound to a given address; exits when stdin closes")
    p.add_argument("--bind", default="127.0.0.1:0")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--join-timeout-ms", type=int, default=1000)
    p.add_argument("--quorum-tick-ms", type=int, default=20)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    a = p.parse_args()
    server = torchft_extension().LighthouseServer(
        bind=a.bind, min_replicas=a.min_replicas, join_timeout_ms=a.join_timeout_ms,
        quorum_tick_ms=a.quorum_tick_ms, heartbeat_timeout_ms=a.heartbeat_timeout_ms)
    address = server.address()
    host = a.bind.rsplit(":", 1)[0].strip("[]")
    if host not in ("", "0.0.0.0", "::"):
        # The server reports the machine's hostname; advertise the address it is bound to.
        address = f"http://{host}:{address.rsplit(':', 1)[1]}"
    print(json.dumps({"address": address, "pid": os.getpid()}), flush=True)
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
