"""Connecting to a Ray cluster is bounded: an address nothing answers at raises within
``RayWorkers(connect_timeout=...)``, naming the address (0.3 waited for ever on ``127.0.0.1:1``).

Each case runs in a child process: ``ray.init`` left waiting in a thread keeps Ray half-started in
the process that called it, and the other Ray tests need a clean one.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from seqloader.prefetcher.ray_options import RayWorkers

pytest.importorskip("ray")

_RUN = textwrap.dedent("""
    import json, time
    import seqloader
    start = time.monotonic()
    try:
        seqloader.prefetch(range(4), 1, method=seqloader.RayWorkers(address={address!r}, connect_timeout={bound}))[0]
        out = {{"raised": None}}
    except Exception as e:
        out = {{"raised": type(e).__name__, "text": str(e)}}
    out["seconds"] = time.monotonic() - start
    print(json.dumps(out))
""")


def _connect(address: str, bound: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", _RUN.format(address=address, bound=bound)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_address_that_refuses_raises_at_once_naming_it():
    with socket.socket() as s:  # a port nothing listens on: bound, never listened
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        out = _connect(f"127.0.0.1:{port}", 600)
    assert out["raised"] == "RuntimeError", out
    assert f"no Ray cluster answers at address='127.0.0.1:{port}' (connection refused)" in out["text"]


def test_an_address_that_never_answers_raises_within_connect_timeout():
    with socket.socket() as s:  # a listener that accepts and never speaks Ray
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        out = _connect(f"127.0.0.1:{port}", 5)
    assert out["raised"] == "RuntimeError", out
    assert f"address='127.0.0.1:{port}'" in out["text"], out  # Ray's own refusal, or no answer within the bound
    assert ("within RayWorkers(connect_timeout=5) seconds" in out["text"]
            or "no Ray cluster to connect to" in out["text"]), out


def test_connect_timeout_is_checked():
    with pytest.raises(ValueError, match="connect_timeout must be a number of seconds > 0"):
        RayWorkers(connect_timeout=0)
