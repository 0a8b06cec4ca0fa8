"""The harness's Ray head waits for the node itself, and starts `ray start` again when it
gives up on a slow raylet (a stand-in command plays `ray start --head --block`)."""

from __future__ import annotations

import sys

import cluster_harness as harness

# First run: the dashboard answers, then `ray start` gives up on the raylet and exits;
# second run: the node starts and blocks, serving the dashboard.
FAKE_HEAD = """
import http.server, pathlib, sys, time
port, marker = int(sys.argv[1]), pathlib.Path(sys.argv[2])
server = http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
if not marker.exists():
    marker.write_text("1")
    time.sleep(1)
    print("Exception: The current node timed out during startup.")
    sys.exit(1)
print("Ray runtime started.")
server.serve_forever()
"""


def test_a_head_that_timed_out_during_startup_is_started_again(tmp_path):
    port = harness.free_port()
    command = [sys.executable, "-c", FAKE_HEAD, str(port), str(tmp_path / "started-once")]
    head = harness.RayHead(command, {}, tmp_path / "head.log", f"http://127.0.0.1:{port}/",
                           ready_timeout_s=30, stop_timeout_s=5)
    with harness.running(head):
        assert "Ray runtime started." in (tmp_path / "head.log").read_text()
    assert "timed out during startup" in (tmp_path / "head.attempt1.log").read_text()
