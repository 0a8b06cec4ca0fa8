"""Let no one in, read from cluster.yaml: token authentication on every `ray start`, no
control port on 0.0.0.0, MLflow behind basic-auth on the private address, secrets made on
the head and never committed. A head and an MLflow server started this way refuse
anonymous clients and serve the commands with the token and the credentials: that runs
in tests/test_job_submit.py, with the users' commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import cluster_harness as harness
import pytest
import yaml

CLUSTER_YAML = harness.REPO_ROOT / "cluster.yaml"


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
    # The admin's password from the head's own MLflow directory (never synced to workers).
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == "$(cat /home/ray/mlflow/admin-password)"
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
    # The one user who is not the admin is the jobs' (csclip-jobs): EDIT, never MANAGE or
    # admin; anonymous requests are refused by the basic-auth app whatever this says.
    assert section["default_permission"] == "EDIT"
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



def test_the_jobs_user_script_fails_at_once_without_a_server(tmp_path):
    # cluster/mlflow_jobs_user.py waits for the MLflow server only while it runs: a server
    # that died is one line in jobs-user.log, not a five-minute wait. (Against a real
    # basic-auth server it runs in tests/test_job_submit.py: the jobs log as its user.)
    import sys

    for name in ("admin-password", "jobs-password"):
        (tmp_path / name).write_text("x" * 64)
    (tmp_path / "server.pid").write_text("999999999")  # no such process
    done = subprocess.run([sys.executable, str(harness.REPO_ROOT / "cluster" / "mlflow_jobs_user.py"),
                           "http://127.0.0.1:9", str(tmp_path / "admin-password"),
                           str(tmp_path / "jobs-password"), str(tmp_path / "server.pid")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "not running" in done.stderr and "csclip-jobs" in done.stderr


def test_the_docs_give_mlflows_default_permission_as_the_ini_sets_it():
    ini = (harness.REPO_ROOT / "cluster" / "mlflow_auth.ini").read_text()
    (set_to,) = re.findall(r"^default_permission = (\w+)$", ini, flags=re.MULTILINE)
    said = re.findall(r"default_permission = (\w+)",
                      (harness.REPO_ROOT / "docs" / "cluster.md").read_text())
    assert said and set(said) == {set_to}, said
