"""Real servers for the cluster tests, all on 127.0.0.1: a moto S3 server, an `mlflow
server` process (sqlite backend, artifacts on S3), a Ray head started with
`ray start --head --block`, and the environment that keeps all of it away from other Ray
instances on the machine.

Every Ray this module starts gets its own RAY_TMPDIR: `ray start` and
`ray.cluster_utils.Cluster` write the head's address to <tmp>/ray/ray_current_cluster, and a
plain `ray.init()` anywhere else on the machine would otherwise join (or, once the head is
gone, fail to reach) our cluster.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
AWS_TEST_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Poll `url` until it answers 200; raise with the process's output if it died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def short_tmpdir(prefix: str) -> Path:
    # Ray's unix sockets live under the temp dir; their paths must stay under 107 bytes.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def isolated_env(ray_tmp: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the venv's bin first on PATH (so `python` and `ray`
    are the venv's, also for `ray job submit` entrypoints), the worktree first on
    PYTHONPATH, a private RAY_TMPDIR and no inherited RAY_ADDRESS."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_AUTH_MODE": "disabled",
        "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
        "MLFLOW_ENABLE_ASYNC_LOGGING": "false",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # see tests/conftest.py
        # `mlflow server` as cluster.yaml starts it: tracking only, without MLflow's job
        # runner and its huey consumers (nine more processes, each importing MLflow).
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        **extra,
    })
    return env


@contextlib.contextmanager
def moto_s3(bucket: str) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with `bucket` created; yields its endpoint URL."""
    import boto3
    from s3_helpers import moto_server

    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, **_boto_credentials()).create_bucket(Bucket=bucket)
        yield endpoint


def _boto_credentials() -> dict[str, str]:
    return {"aws_access_key_id": AWS_TEST_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
            "region_name": AWS_TEST_ENV["AWS_DEFAULT_REGION"]}


class Service:
    """A server process we start and stop ourselves; ready when `ready_url` answers 200.

    start() returns at once, so several services boot in parallel (`running`)."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path, ready_url: str,
                 cwd: Path | None = None, ready_timeout_s: float = 120, stop_timeout_s: float = 60):
        self.command, self.env, self.log_path, self.cwd = command, env, log_path, cwd
        self.ready_url, self.ready_timeout_s = ready_url, ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self._log = self.log_path.open("w")
        # Its own session: its descendants can be found (and ended) by the session id.
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        wait_for_http(self.ready_url, self.ready_timeout_s, self.process)

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process, self.stop_timeout_s)
            self._log.close()


@contextlib.contextmanager
def running(*services: Service) -> Iterator[None]:
    """Start every service, then wait until all are ready; stop them all at the end."""
    try:
        for service in services:
            service.start()
        for service in services:
            service.wait_ready()
        yield
    finally:  # stopped in parallel: each may take its grace period
        stopping = [threading.Thread(target=service.stop) for service in services]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()


def mlflow_server(workdir: Path, env: dict[str, str], artifacts_destination: str | None = None,
                  admin_password: str | None = None) -> tuple[Service, str]:
    """A real `mlflow server`: sqlite backend in `workdir`, artifacts in
    `artifacts_destination` (e.g. s3://bucket/mlflow on moto: set MLFLOW_S3_ENDPOINT_URL in
    `env`) or in `workdir`. Returns the service and its URL.

    admin_password: run it as the cluster's head does (cluster.yaml): MLflow's basic-auth
    app with cluster/mlflow_auth.ini (its users' database moved into `workdir`), the admin
    `csclip` created at the first start with this password, everyone else refused."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    backend = workdir / "mlflow.db"
    auth: list[str] = []
    if admin_password is not None:
        from mlflow_store import fresh_store

        ini = (REPO_ROOT / "cluster" / "mlflow_auth.ini").read_text().replace(
            "sqlite:////home/ray/mlflow/basic_auth.db", f"sqlite:///{workdir / 'basic_auth.db'}")
        (workdir / "auth.ini").write_text(ini)
        env = {**env, "MLFLOW_AUTH_CONFIG_PATH": str(workdir / "auth.ini"),
               "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)}
        auth = ["--app-name", "basic-auth"]
        # The basic-auth app migrates only its users' database: the tracking store must be
        # migrated already (its Default experiment, with a client-side artifact location,
        # is not used by the tests).
        backend = fresh_store(backend)
    command = [str(VENV_BIN / "mlflow"), "server", *auth, "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{backend}",
               "--artifacts-destination", artifacts_destination or str(workdir / "artifacts")]
    return Service(command, env, workdir / "server.log", f"{url}/health", cwd=workdir), url


def ray_head(ray_tmp: Path, env: dict[str, str], num_cpus: int = 4,
             ready_path: str = "/api/version") -> tuple[Service, dict]:
    """`ray start --head --block` with the dashboard (and so the job server) on 127.0.0.1
    and free ports. Returns the service and {"address": GCS host:port, "dashboard": URL}.
    ready_path: the dashboard path that answers 200 once it is up (with token
    authentication on, only the health checks answer without the token).
    Stopped by terminating the --block process we started (its handler stops the head's
    processes), never with `ray stop`, which would stop every Ray on the machine."""
    ports = {name: free_port() for name in (
        "port", "dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")}
    command = [str(VENV_BIN / "ray"), "start", "--head", "--block",
               "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
               "--include-dashboard", "true", "--num-cpus", str(num_cpus),
               "--temp-dir", str(ray_tmp / "ray"),
               *[f"--{name}={port}" for name, port in ports.items()]]
    dashboard = f"http://127.0.0.1:{ports['dashboard-port']}"
    # A graceful stop can take half a minute after jobs ran; this head and its session
    # directory are ours alone, so after 5 s the rest is ended process by process.
    service = RayHead(command, env, ray_tmp / "head.log", f"{dashboard}{ready_path}",
                      stop_timeout_s=5)
    return service, {"address": f"127.0.0.1:{ports['port']}", "dashboard": dashboard}


class RayHead(Service):
    """`ray start --head --block`, ready once its dashboard answers and the node itself has
    started ("Ray runtime started."): the dashboard answers before the raylet has
    registered, and `ray start` gives up (and stops every process it started) when the
    raylet takes more than Ray's fixed 30 s to register, as on a loaded 2-core machine.
    It is started again, on the same ports, whenever it exits before the node started
    (that timeout, or "Failed to start the dashboard"), up to `attempts` times in all."""

    STARTED = "Ray runtime started."

    def __init__(self, *args, attempts: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.attempts = attempts
        self.env = {**self.env, "PYTHONUNBUFFERED": "1"}  # its log shows each line at once

    def wait_ready(self) -> None:
        for attempt in range(1, self.attempts + 1):
            deadline = time.monotonic() + self.ready_timeout_s
            while time.monotonic() < deadline:
                log = self.log_path.read_text(errors="replace")
                if self.process.poll() is not None:
                    break
                if self.STARTED in log:
                    wait_for_http(self.ready_url, max(deadline - time.monotonic(), 1),
                                  self.process)
                    return
                time.sleep(0.5)
            else:
                raise TimeoutError(f"the Ray head did not start within "
                                   f"{self.ready_timeout_s:.0f} s:\n{log[-3000:]}")
            if attempt == self.attempts:  # a timeout, or the dashboard failed to start
                raise RuntimeError(f"the Ray head exited with {self.process.returncode}:\n"
                                   f"{log[-3000:]}")
            self.stop()  # whatever it left behind, then the same command again
            self.log_path.rename(self.log_path.with_suffix(f".attempt{attempt}.log"))
            self.start()


# What `ray job submit` answers while a head under load is still coming up: the dashboard
# answers before the head's agent has registered (the job server waits 10 s for it), or
# the client cannot reach Ray yet. Nothing was submitted: submitting again is safe. Or the
# job's agent timed out fetching the uploaded working_dir from the GCS (seen at load 30 on 2
# cores): the job failed while setting up its runtime_env, before any of its code ran.
TRANSIENT_SUBMIT_ERRORS = ("No available agent to submit job", "Failed to connect to Ray",
                           "Failed to download runtime_env file package")


def submit_until_accepted(submit: Callable[[], subprocess.CompletedProcess], attempts: int = 4,
                          wait_s: float = 5) -> subprocess.CompletedProcess:
    """Run `submit` (a `ray job submit` command) again while it fails with one of
    TRANSIENT_SUBMIT_ERRORS, up to `attempts` times; its last result."""
    for _ in range(attempts - 1):
        done = submit()
        output = f"{done.stdout or ''}{done.stderr or ''}"
        if done.returncode == 0 or not any(m in output for m in TRANSIENT_SUBMIT_ERRORS):
            return done
        time.sleep(wait_s)
    return submit()


def _stop(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """Terminate a process we started (SIGTERM, then SIGKILL) and wait for it; then, one by
    one, any of its descendants still alive (they share the session it was started in)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while (left := session_members(process.pid)) and time.monotonic() < deadline:
        for pid in left:  # SIGTERM for 3 s, then SIGKILL
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 7 else signal.SIGKILL)
        time.sleep(0.5)


def session_members(session_id: int) -> list[int]:
    """Live processes of a session (start_new_session=True made its leader's pid the id),
    read from /proc: field 6 of /proc/<pid>/stat is the session id, field 3 the state."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def files_under(directory: Path) -> list[str]:
    """Every file and directory under `directory`, relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def split_coordinators() -> dict[str, dict]:
    """Ray Data's SplitCoordinator actors the connected Ray instance has started, alive or
    dead, by actor id: state, start and end (ms; 0 while alive) and owner (the worker
    group's DatasetManager, which creates them)."""
    import ray._private.state

    return {actor_id: {"state": a["State"], "start": a["StartTime"], "end": a["EndTime"],
                       "owner": f"{a['OwnerAddress']['IPAddress']}:{a['OwnerAddress']['Port']}"}
            for actor_id, a in ray._private.state.actors().items()
            if a["ActorClassName"] == "SplitCoordinator"}


def overlapping_lifetimes(coordinators: list[dict], ahead: int = 1) -> list[tuple[dict, dict]]:
    """Pairs of the same owner alive at once, other than an epoch's and the next's (the
    workers open the next epoch before the current one ends: csclip.train.lookahead):
    (earlier, later) where the later started more than `ahead` coordinators after the
    earlier and the earlier had not ended by then."""
    by_owner: dict[str, list[dict]] = {}
    for coordinator in sorted(coordinators, key=lambda c: c["start"]):
        by_owner.setdefault(coordinator["owner"], []).append(coordinator)
    return [(a, b) for group in by_owner.values() for i, a in enumerate(group)
            for b in group[i + 1 + ahead:] if not 0 < a["end"] <= b["start"]]
