"""Let no one in: a Ray head started as cluster.yaml starts it (RAY_AUTH_MODE=token, the
token in a file named by RAY_AUTH_TOKEN_PATH, the dashboard on 127.0.0.1) refuses a job
submitted without the token and runs one submitted with it; and cluster.yaml itself binds
no control port to 0.0.0.0 without authentication."""

from __future__ import annotations

import base64
import json
import re
import secrets
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import cluster_harness as harness
import pytest
import yaml
from mlflow_store import fresh_store

CLUSTER_YAML = harness.REPO_ROOT / "cluster.yaml"


def _submit(head: dict, env: dict, marker: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ray", "job", "submit", "--address", head["dashboard"], "--",
         "python", "-c", f"print('{marker}')"],
        cwd=harness.REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)


def _post_job(head: dict, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"{head['dashboard']}/api/jobs/", method="POST",
        data=json.dumps({"entrypoint": "echo never-run"}).encode(),
        headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_job_without_the_token_is_refused_and_with_it_runs(tmp_path):
    ray_tmp = harness.short_tmpdir("csclip-auth-")
    token = tmp_path / "ray-token"  # as head_setup_commands makes it
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    head_env = harness.isolated_env(ray_tmp, RAY_AUTH_MODE="token",
                                    RAY_AUTH_TOKEN_PATH=str(token))
    service, head = harness.ray_head(ray_tmp, head_env, num_cpus=1, ready_path="/api/gcs_healthz")
    # Clients: one with the token (as docs/cluster.md sets it up after `ray rsync-down`),
    # one that knows nothing of it, one with a wrong token.
    with_token = harness.isolated_env(ray_tmp, RAY_AUTH_MODE="token",
                                      RAY_AUTH_TOKEN_PATH=str(token))
    without = harness.isolated_env(ray_tmp)
    without.pop("RAY_AUTH_TOKEN_PATH", None)
    wrong = harness.isolated_env(ray_tmp, RAY_AUTH_MODE="token",
                                 RAY_AUTH_TOKEN=secrets.token_hex(32))
    with harness.running(service):
        with urllib.request.urlopen(f"{head['dashboard']}/api/authentication_mode") as answer:
            assert json.loads(answer.read())["authentication_mode"] == "token"
        # The job API itself, as any host that reached the port would call it.
        assert _post_job(head, {}) == 401
        assert _post_job(head, {"Authorization": f"Bearer {secrets.token_hex(32)}"}) == 403
        refused = _submit(head, without, "no-token-ran")
        assert refused.returncode != 0
        assert "no-token-ran" not in refused.stdout
        assert "Unauthorized: Missing authentication token" in refused.stderr
        refused = _submit(head, wrong, "wrong-token-ran")
        assert refused.returncode != 0 and "wrong-token-ran" not in refused.stdout
        assert "Forbidden: Invalid authentication token" in refused.stderr
        accepted = harness.submit_until_accepted(
            lambda: _submit(head, with_token, "csclip-token-ok"))
        assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-2000:]
        assert "csclip-token-ok" in accepted.stdout and "succeeded" in accepted.stdout
    shutil.rmtree(ray_tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# cluster.yaml, read
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _start_commands(raw: dict) -> list[str]:
    return [*raw["head_start_ray_commands"], *raw["worker_start_ray_commands"]]


def _exports(command: str) -> dict[str, str]:
    """The variables a start command exports (or sets for one program) as NAME=value,
    a value being a word or a $(...) substitution."""
    return dict(re.findall(r"(?<![\w-])([A-Z][A-Z0-9_]*)=(\$\([^)]*\)|[^\s;]+)", command))


def test_every_ray_start_runs_with_token_authentication_and_the_match_level(raw):
    starts = [c for c in _start_commands(raw) if "ray start" in c]
    assert len(starts) == 2  # the head's and the workers'
    for command in starts:
        exported = _exports(command)
        assert exported["RAY_AUTH_MODE"] == "token", command
        assert exported["RAY_AUTH_TOKEN_PATH"] == "/home/ray/csclip-secrets/ray-token"
        # The ray and ray-llm images may differ in Python's patch version.
        assert exported["RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL"] == "minor"
        # No token in the file itself, ever (neither RAY_AUTH_TOKEN nor a literal value).
        assert "RAY_AUTH_TOKEN" not in exported


def test_no_control_port_on_all_interfaces_without_authentication(raw):
    [head_start] = [c for c in raw["head_start_ray_commands"] if "ray start --head" in c]
    # The dashboard and its job API: loopback only (reached through `ray dashboard`).
    assert re.search(r"--dashboard-host[= ]127\.0\.0\.1\b", head_start)
    for command in _start_commands(raw):
        assert "0.0.0.0" not in command, command  # no listener on all interfaces
    # Ray's own ports that must face the other nodes (GCS 6379, object manager, raylet)
    # listen on the node's address and, with token mode on every `ray start`, refuse
    # callers without the token (test above; GCS and raylet check it on every gRPC call).
    [mlflow] = [c for c in raw["head_start_ray_commands"] if "mlflow server" in c]
    assert "--app-name basic-auth" in mlflow
    assert "--host $(hostname -I | awk '{print $1}')" in mlflow  # the private address
    env = _exports(mlflow)
    assert env["MLFLOW_AUTH_CONFIG_PATH"] == "/home/ray/csclip/mlflow_auth.ini"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"  # no job runner beside it
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == "$(cat /home/ray/csclip-secrets/mlflow-password)"
    assert "0.0.0.0/0" not in str(raw["provider"])  # no rule open to everyone here
    # Every node type brings its own security group: without one Ray makes a group whose
    # SSH rule is 0.0.0.0/0 (ray/autoscaler/_private/aws/config.py).
    groups = {str(t["node_config"].get("SecurityGroupIds"))
              for t in raw["available_node_types"].values()}
    assert len(groups) == 1 and "None" not in groups


def test_mlflow_auth_config_keeps_everyone_else_out():
    import configparser

    ini = configparser.ConfigParser()
    ini.read(harness.REPO_ROOT / "cluster" / "mlflow_auth.ini")
    section = ini["mlflow"]
    assert section["default_permission"] == "NO_PERMISSIONS"
    assert "admin_password" not in section  # from the head's secrets, at the first start
    assert section["database_uri"].startswith("sqlite:////home/ray/mlflow/")


def test_secrets_are_made_on_the_head_and_never_committed(raw):
    head_setup = " ".join(raw["head_setup_commands"])
    assert "ray-token" in head_setup and "secrets.token_hex(32)" in head_setup
    assert raw["cluster_synced_files"] == ["/home/ray/csclip-secrets"]
    assert "-v /home/ubuntu/csclip-secrets:/home/ray/csclip-secrets" in \
        raw["docker"]["head_run_options"]
    assert f"-v /tmp/ray_tmp_mount/{raw['cluster_name']}/home/ray/csclip-secrets:" \
        "/home/ray/csclip-secrets:ro" in raw["docker"]["worker_run_options"]
    tracked = subprocess.run(["git", "ls-files"], cwd=harness.REPO_ROOT, capture_output=True,
                             text=True).stdout.split()
    assert not [p for p in tracked if "secret" in Path(p).name or "token" in Path(p).name
                or Path(p).name == "auth_token"]


@pytest.mark.slow  # an MLflow server and a client process: ~1 min on 2 busy cores
def test_the_mlflow_server_refuses_anonymous_clients_and_takes_the_jobs_credentials(tmp_path):
    """`mlflow server --app-name basic-auth` with cluster/mlflow_auth.ini (its database
    moved into tmp_path) and the admin password from the environment, as the head starts
    it: anonymous requests get 401; a client with MLFLOW_TRACKING_USERNAME / _PASSWORD in
    its environment (what every Ray process on the cluster inherits) logs a run."""
    ini = (harness.REPO_ROOT / "cluster" / "mlflow_auth.ini").read_text().replace(
        "sqlite:////home/ray/mlflow/basic_auth.db", f"sqlite:///{tmp_path / 'basic_auth.db'}")
    (tmp_path / "auth.ini").write_text(ini)
    password = secrets.token_hex(32)
    env = harness.isolated_env(harness.short_tmpdir("csclip-mlflow-auth-"),
                               MLFLOW_AUTH_CONFIG_PATH=str(tmp_path / "auth.ini"),
                               MLFLOW_AUTH_ADMIN_PASSWORD=password,
                               MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(32))
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    server = harness.Service(
        [str(harness.VENV_BIN / "mlflow"), "server", "--app-name", "basic-auth",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         # A migrated store (tests/mlflow_store.py): the server migrates only its users'
         # database. Its Default experiment, which keeps a client-side artifact location
         # there, is not used here.
         "--backend-store-uri", f"sqlite:///{fresh_store(tmp_path / 'mlflow.db')}",
         "--artifacts-destination", str(tmp_path / "artifacts")],
        env, tmp_path / "server.log", f"{url}/health", cwd=tmp_path)
    client_script = (
        "import mlflow; mlflow.set_tracking_uri('" + url + "'); "
        "mlflow.set_experiment('auth'); "
        "run = mlflow.start_run(); mlflow.log_metric('x', 1.0); mlflow.end_run(); print('RUN', run.info.run_id)")
    with harness.running(server):
        search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(search, timeout=10)
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as refused:  # a wrong password
            urllib.request.urlopen(urllib.request.Request(search, headers={
                "Authorization": "Basic " + base64.b64encode(b"csclip:wrong").decode()}),
                timeout=10)
        assert refused.value.code == 401
        job_env = {**env, "MLFLOW_TRACKING_USERNAME": "csclip",
                   "MLFLOW_TRACKING_PASSWORD": password}
        logged = subprocess.run([str(harness.VENV_BIN / "python"), "-c", client_script],
                                env=job_env, capture_output=True, text=True, timeout=120)
        assert logged.returncode == 0, logged.stderr[-2000:]
        assert "RUN " in logged.stdout
