"""The commands users were promised, exactly as they type them, against a local Ray head
and MLflow server started as cluster.yaml starts them: `ray start --head` with token
authentication (RAY_AUTH_MODE=token, the token in a file named by RAY_AUTH_TOKEN_PATH,
the dashboard on 127.0.0.1) and `mlflow server` behind MLflow's basic-auth app, the
credentials in every Ray process's environment. A job submitted without the token, or with
a wrong one, is refused; with it, `ray job submit --working-dir . -- python
pipelines/train.py` runs, then `python pipelines/evaluate.py` on the checkpoint and
`python tune/ablate.py --grid lr --address <head>`; the runs land in the tracking server
the user configured, not in the job's temporary working directory; anonymous clients of
that server are refused."""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import cluster_harness as harness
import pytest

TINY = ["model.name=csclip-tiny", "model.image_size=32", "data.world.image_size=32",
        "data.world.num_train=16", "data.world.num_val=8", "data.world.num_test=0",
        "data.batch_size=8", "data.shuffle_buffer=0", "optim.max_steps=2",
        "optim.warmup_steps=0", "optim.lr=1e-4", "run.checkpoint_every=2", "run.log_every=1"]


def _sets(overrides: list[str]) -> list[str]:
    return [token for override in overrides for token in ("--set", override)]


def _run(command: list[str], env: dict, log, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a user command from the project root, its output kept in the test's log."""
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    started = time.monotonic()
    done = subprocess.run(command, cwd=harness.REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    log.write(f"{done.stdout}\n[exit {done.returncode} after {time.monotonic() - started:.0f} s]\n")
    log.flush()
    return done


def _post_job(head: dict, headers: dict[str, str]) -> int:
    """The job API itself, as any host that reached the port would call it."""
    request = urllib.request.Request(
        f"{head['dashboard']}/api/jobs/", method="POST",
        data=json.dumps({"entrypoint": "echo never-run"}).encode(),
        headers={"Content-Type": "application/json", **headers})
    return _status(request)


def _status(request: urllib.request.Request | str) -> int:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _submit_marker(head: dict, env: dict, log, marker: str) -> subprocess.CompletedProcess:
    return _run(["ray", "job", "submit", "--address", head["dashboard"], "--",
                 "python", "-c", f"print('{marker}')"], env, log, timeout=180)


@pytest.mark.slow
def test_used_by_commands_against_a_real_ray_head(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    ray_tmp = harness.short_tmpdir("csclip-head-")
    token = tmp_path / "ray-token"  # as head_setup_commands makes it
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    password = secrets.token_hex(32)  # the jobs' (mlflow-jobs-password)
    admin_password = tmp_path / "admin-password"  # the head's own
    admin_password.write_text(secrets.token_hex(32))
    # As cluster.yaml exports them before every `ray start`: every driver, Train worker,
    # Tune trial and Data task inherits the token and MLflow's credentials, the jobs' user's
    # (made by cluster/mlflow_jobs_user.py below), not the admin's.
    cluster_vars = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "MLFLOW_TRACKING_USERNAME": "csclip-jobs",
                    "MLFLOW_TRACKING_PASSWORD": password}
    # Without the venv's bin first on PATH the job's `python` is the system one.
    env = harness.isolated_env(ray_tmp, CSCLIP_CACHE_DIR=str(tmp_path / "cache"),
                               **cluster_vars)
    env.pop("MLFLOW_TRACKING_URI", None)
    # Clients that know nothing of the token, or have a wrong one.
    without = {k: v for k, v in env.items() if k not in cluster_vars}
    without["RAY_AUTH_MODE"] = "disabled"
    wrong = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    wrong.pop("RAY_AUTH_TOKEN_PATH")
    storage = tmp_path / "runs"
    project_stores = _local_stores()
    mlflow, mlflow_uri = harness.mlflow_server(tmp_path / "mlflow", without,
                                               admin_password=admin_password.read_text())
    # With token authentication on, only the health checks answer without the token.
    ray_head, head = harness.ray_head(ray_tmp, env, ready_path="/api/gcs_healthz")
    started = time.monotonic()
    with (tmp_path / "commands.log").open("w") as log, harness.running(ray_head, mlflow):
        log.write(f"[head and MLflow server ready after {time.monotonic() - started:.0f} s]\n")
        # As head_start_ray_commands does once the server runs: the jobs' user, no admin.
        (tmp_path / "jobs-password").write_text(password)
        (tmp_path / "server.pid").write_text(str(mlflow.process.pid))
        jobs_user = _run(["python", str(harness.REPO_ROOT / "cluster" / "mlflow_jobs_user.py"),
                          mlflow_uri, str(admin_password), str(tmp_path / "jobs-password"),
                          str(tmp_path / "server.pid")], without, log, timeout=120)
        assert jobs_user.returncode == 0 and "csclip-jobs: created" in jobs_user.stdout
        assert _status(urllib.request.Request(
            f"{mlflow_uri}/api/2.0/mlflow/users/create", method="POST",
            data=json.dumps({"username": "mallory", "password": "x"}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Basic " +
                     base64.b64encode(f"csclip-jobs:{password}".encode()).decode()})) == 403
        with urllib.request.urlopen(f"{head['dashboard']}/api/authentication_mode") as answer:
            assert json.loads(answer.read())["authentication_mode"] == "token"
        assert _post_job(head, {}) == 401
        assert _post_job(head, {"Authorization": f"Bearer {secrets.token_hex(32)}"}) == 403
        refused = _submit_marker(head, without, log, "no-token-ran")
        assert refused.returncode != 0 and "no-token-ran" not in refused.stdout
        assert "Unauthorized: Missing authentication token" in refused.stdout
        refused = _submit_marker(head, wrong, log, "wrong-token-ran")
        assert refused.returncode != 0 and "wrong-token-ran" not in refused.stdout
        assert "Forbidden: Invalid authentication token" in refused.stdout
        # The tracking server: nothing for anonymous clients or a wrong password.
        search = f"{mlflow_uri}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(search) == 401
        assert _status(urllib.request.Request(search, headers={
            "Authorization": "Basic " + base64.b64encode(b"csclip:wrong").decode()})) == 401

        runtime_env = json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": mlflow_uri}})
        train_overrides = [*TINY, f"run.storage_path={storage}", "tracking.experiment=job"]
        train = harness.submit_until_accepted(lambda: _run(
            ["ray", "job", "submit", "--address", head["dashboard"], "--working-dir", ".",
             "--runtime-env-json", runtime_env, "--", "python", "pipelines/train.py",
             "--config", "configs/default.yaml", *_sets(train_overrides)], env, log))
        assert train.returncode == 0, train.stdout[-3000:]
        assert "succeeded" in train.stdout
        [line] = [t for t in train.stdout.splitlines() if "final checkpoint" in t]
        checkpoint = line.rsplit(" ", 1)[1]
        assert checkpoint.startswith(f"{storage}/csclip-") and checkpoint.endswith("/final")
        assert (Path(checkpoint) / "model.pt").is_file()  # where the config said

        user_env = {**env, "MLFLOW_TRACKING_URI": mlflow_uri}
        evaluate = _run(["python", "pipelines/evaluate.py", "--checkpoint", checkpoint,
                         "--out", str(tmp_path / "eval"),
                         *_sets(["data.world.num_val=8", "data.world.image_size=32",
                                 "benchmark.num_bootstrap=10", "suites.num_world_pairs=4",
                                 "suites.num_replace_items=4", "tracking.experiment=job-eval"])],
                        user_env, log)
        assert evaluate.returncode == 0, evaluate.stdout[-3000:]

        # One trial (the grid's only value is the base's): the sweep itself, its trials'
        # scheduling and resumption are tests/test_ablation.py's; here, the command against
        # a real head and where its runs land: on the server, children of the sweep's run.
        sweep = _run(["python", "tune/ablate.py", "--grid", "lr=1e-4", "--address",
                      head["address"],
                      *_sets([*TINY, f"run.storage_path={storage}", "tracking.experiment=job-tune"])],
                     user_env, log, timeout=400)
        assert sweep.returncode == 0, sweep.stdout[-3000:]

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "csclip-jobs")  # this process reads too
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        client = MlflowClient(mlflow_uri)
        [train_run] = _search(client, "job")
        assert train_run.info.status == "FINISHED"
        assert train_run.data.tags["checkpoint_uri"] == checkpoint
        assert train_run.data.metrics["step"] == 2
        [eval_run] = _search(client, "job-eval")
        assert "ht_all" in eval_run.data.metrics  # one run per model, plain metric keys
        sweep_runs = _search(client, "job-tune")
        [parent] = [r for r in sweep_runs if r.data.tags.get("csclip_role") == "sweep"]
        children = [r for r in sweep_runs if r.data.tags.get("csclip_role") == "trial"]
        assert [r.data.tags["csclip_setting"] for r in children] == ["base"]
        assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
        assert all(r.info.status == "FINISHED" and "ht_all" in r.data.metrics for r in children)
        assert parent.info.status == "FINISHED"
        parent_artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
        assert {"ablation.md", "ablation.csv", "ablation.png"} <= parent_artifacts
        # Nothing was written into the job's unpacked working directory under the session.
        leftovers = [str(p) for p in ray_tmp.rglob("mlflow.db")] + \
            [str(p) for p in ray_tmp.rglob("mlruns")] + [str(p) for p in ray_tmp.rglob("runs")]
        assert leftovers == []
        stopping = time.monotonic()
    with (tmp_path / "commands.log").open("a") as log:
        log.write(f"[head and MLflow server stopped after {time.monotonic() - stopping:.0f} s]\n")
    assert _local_stores() == project_stores  # no store created or written in the project
    shutil.rmtree(ray_tmp, ignore_errors=True)  # the head's session files (on success only)


def _local_stores() -> dict[str, int]:
    """The default local tracking stores in the project directory, with their mtimes."""
    return {p.name: p.stat().st_mtime_ns for p in (harness.REPO_ROOT / "mlflow.db",
                                                    harness.REPO_ROOT / "mlruns") if p.exists()}


def _search(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} on the server"
    return client.search_runs([found.experiment_id])

