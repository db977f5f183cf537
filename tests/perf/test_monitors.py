"""monitors: the process that serves a loopback endpoint is found by its listening port;
an endpoint elsewhere has none on this machine."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from adaptcheck.perf.monitors import local_server_pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_the_listening_process_of_a_loopback_url() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert local_server_pid(f"http://127.0.0.1:{port}/v1") == os.getpid()
        assert local_server_pid(f"localhost:{port}") == os.getpid()
        # Same port, but a name that only starts like a loopback address: not this machine.
        assert local_server_pid(f"http://127.example.com:{port}/v1") is None
        assert local_server_pid(f"http://10.0.0.7:{port}/v1") is None
