"""The multi-node path end to end: tests/cluster_scenario.py on a simulated
cluster (a head and two worker nodes from ray.cluster_utils.Cluster, moto S3, a real
`mlflow server`), in its own process because this test session already has its Ray."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter

import cluster_harness as harness
import pytest
import torch


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    """Run the scenario once from an empty working directory; its result as a dict."""
    workdir = tmp_path_factory.mktemp("cluster")
    cwd, ray_tmp = workdir / "cwd", harness.short_tmpdir("csclip-cluster-")
    cwd.mkdir()
    env = harness.isolated_env(ray_tmp, CSCLIP_CACHE_DIR=str(workdir / "cache"),
                               **harness.AWS_TEST_ENV)
    for name in ("MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        env.pop(name, None)
    result_path = workdir / "result.json"
    log = workdir / "scenario.log"
    with log.open("w") as out:
        process = subprocess.run(
            [sys.executable, str(harness.REPO_ROOT / "tests" / "cluster_scenario.py"),
             str(result_path), str(workdir)],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    if process.returncode == 0:
        shutil.rmtree(ray_tmp, ignore_errors=True)  # the cluster's session files
    else:
        pytest.fail(f"cluster scenario failed ({process.returncode}); last lines of {log}:\n"
                    + "\n".join(log.read_text().splitlines()[-40:]))
    return {**json.loads(result_path.read_text()), "log": log.read_text()}


def _runs(result: dict, experiment: str) -> list[dict]:
    return result["mlflow"][experiment]["runs"]


@pytest.mark.slow
def test_extraction_writes_units_to_s3_and_logs_to_the_server(scenario):
    extract = scenario["extract"]
    assert extract["read"] == 44 == extract["with_units"] + extract["rejected"]
    assert extract["units_uri"] == "s3://csclip-cluster/extract/units"
    assert any(k.startswith("extract/units/part-") for k in scenario["s3"])
    [run] = _runs(scenario, "cluster-extract")
    assert run["run_id"] == extract["mlflow_run_id"] and run["status"] == "FINISHED"
    assert "extract" in run["artifacts"]  # uploaded through the server to the bucket
    assert any(k.startswith("mlflow/") and k.endswith("summary.txt") for k in scenario["s3"])


@pytest.mark.slow
def test_training_on_two_nodes_resumes_from_s3_after_the_workers_fail(scenario):
    train = scenario["train"]
    assert train["checkpoint_uri"] == "s3://csclip-cluster/runs/two-nodes/final"
    # Failed after step 3: the restarted group resumed from the step-2 checkpoint on S3.
    assert train["step"] == 6 and train["resumed_from"] == 2
    # Two attempts of two workers: each attempt had one worker on each node.
    nodes = scenario["nodes"]
    assert train["worker_nodes"] == sorted([nodes["node_a"], nodes["node_b"]] * 2)
    assert {"runs/two-nodes/final/model.pt", "runs/two-nodes/final/model_spec.json"} <= \
        {k.removeprefix("csclip-cluster/") for k in scenario["s3"]}
    # One MLflow run across the restart, on the server, with every step logged by rank 0,
    # step 3 twice: by the failed workers and by their restarted successors.
    [run] = _runs(scenario, "cluster-train")
    assert run["run_id"] == train["mlflow_run_id"] and run["status"] == "FINISHED"
    assert [step for step, _ in run["loss_history"]] == [1, 2, 3, 3, 4, 5, 6]
    assert run["tags"]["checkpoint_uri"] == train["checkpoint_uri"]
    # The restarted workers, in new processes on both nodes, skipped the two batches the
    # checkpoint had trained on and drew step 3's batch and text slots again: the same loss.
    before, after = (loss for step, loss in run["loss_history"] if step == 3)
    assert torch.allclose(torch.tensor(after, dtype=torch.float64),
                          torch.tensor(before, dtype=torch.float64), rtol=1e-6, atol=0), \
        run["loss_history"]
    # Each epoch split over the two nodes by its own SplitCoordinator: the failed group's
    # epoch 0, the restarted group's epochs 0 and 1 (steps 3-4, 5-6), the restarted
    # group's first ended before its second began.
    coordinators = train["split_coordinators"]
    assert sorted(Counter(c["owner"] for c in coordinators).values()) == [1, 2]
    assert harness.overlapping_lifetimes(coordinators) == []
    # Ray Train never asks an ended coordinator to shut down (nor logs that it died).
    assert "ActorDiedError" not in scenario["log"]


@pytest.mark.slow
def test_the_s3_checkpoint_is_evaluated(scenario):
    evaluate = scenario["evaluate"]
    assert evaluate["exit_code"] == 0 and "table1.md" in evaluate["files"]
    [run] = _runs(scenario, "cluster-eval")
    [ht_all] = [v for k, v in run["metrics"].items() if k.endswith("/ht_all")]  # <model>/ht_all
    assert 0 <= ht_all <= 100


@pytest.mark.slow
def test_nothing_is_written_to_the_drivers_working_directory(scenario):
    assert scenario["cwd_files"] == []
    # Every run on the server; its artifacts in the bucket, not next to a database.
    for experiment in scenario["mlflow"].values():
        assert experiment["artifact_location"].startswith("mlflow-artifacts:")
