"""The multi-node path end to end: tests/cluster_scenario.py on a simulated
cluster (a head and two worker nodes from ray.cluster_utils.Cluster, moto S3, a real
`mlflow server`), in its own process because this test session already has its Ray."""

from __future__ import annotations

import json
import re
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


def _close(losses: list, expected: list) -> bool:
    """(step, loss) pairs: the same steps, each loss within 1e-6 of the expected one's."""
    return ([step for step, _ in losses] == [step for step, _ in expected]
            and torch.allclose(torch.tensor([loss for _, loss in losses], dtype=torch.float64),
                               torch.tensor([loss for _, loss in expected], dtype=torch.float64),
                               rtol=1e-6, atol=0))


@pytest.mark.slow
def test_training_on_two_nodes_resumes_from_s3_after_a_worker_is_killed(scenario):
    train = scenario["train"]
    assert train["checkpoint_uri"] == "s3://csclip-cluster/runs/two-nodes/final"
    # Rank 1's process was SIGKILLed after step 7 (4 steps an epoch, checkpoints at 3 and
    # 6). Ray Train registers a checkpoint when its controller takes the report from the
    # workers, one report at a time: step 6's report waited for step 3's to be taken, but
    # may itself have died with the worker. So the restarted group resumed from the step-6
    # checkpoint on S3 (two batches into the second epoch) or the step-3 one (three into
    # the first): in the middle of an epoch either way, with steps trained again.
    resumed = train["resumed_from"]
    assert train["step"] == 8 and resumed in (3, 6)
    # Every rank's losses, each the uninterrupted run's: rank 1's killed process logged
    # steps 1-7; rank 0's, ended by Ray once rank 1 died, got at least to step 6; each
    # restarted process skipped its shard's batches before the checkpoint through the
    # shuffle buffer and trained from there to step 8.
    reference = scenario["train_reference"]["losses"]
    assert scenario["train_reference"]["step"] == 8 and sorted(reference) == ["0", "1"]
    assert sorted(train["losses"]) == ["0", "1"]
    for rank in ("0", "1"):
        [uninterrupted], (killed, restarted) = reference[rank], train["losses"][rank]
        assert [step for step, _ in uninterrupted] == list(range(1, 9))
        assert len(killed) in ((7,) if rank == "1" else (6, 7)), killed
        assert _close(killed, uninterrupted[:len(killed)]), (rank, killed, uninterrupted)
        assert _close(restarted, uninterrupted[resumed:]), (rank, restarted, uninterrupted)
    # Two attempts of two workers: each attempt had one worker on each node.
    nodes = scenario["nodes"]
    assert train["worker_nodes"] == sorted([nodes["node_a"], nodes["node_b"]] * 2)
    assert {"runs/two-nodes/final/model.pt", "runs/two-nodes/final/model_spec.json"} <= \
        {k.removeprefix("csclip-cluster/") for k in scenario["s3"]}
    # One MLflow run across the restart, on the server, with every step logged by rank 0:
    # the killed attempt's, then the restarted one's from the checkpoint on.
    [run] = _runs(scenario, "cluster-train")
    assert run["run_id"] == train["mlflow_run_id"] and run["status"] == "FINISHED"
    history = run["loss_history"]
    steps = [step for step, _ in history]
    assert steps in ([*range(1, last + 1), *range(resumed + 1, 9)] for last in (6, 7)), steps
    rank_0 = dict(reference["0"][0])
    assert _close(history, [(step, rank_0[step]) for step, _ in history]), history
    assert run["tags"]["checkpoint_uri"] == train["checkpoint_uri"]
    # Each epoch split over the two nodes by its own SplitCoordinator: the killed group's
    # epochs 0 and 1, the restarted group's from its checkpoint's epoch on; none alive
    # beside another than the next epoch's (opened early: csclip.train.lookahead).
    coordinators = train["split_coordinators"]
    assert sorted(Counter(c["owner"] for c in coordinators).values()) == \
        ([2, 2] if resumed == 3 else [1, 2])
    assert harness.overlapping_lifetimes(coordinators) == []
    # Ray Train never asks an ended coordinator to shut down (nor logs that it died): the
    # only actor the log reports dead is the killed worker.
    died = re.findall(r"ActorDiedError[^\n]*\n[^\n]*class_name: (\w+)", scenario["log"])
    assert set(died) <= {"RayTrainWorker"}, died


@pytest.mark.slow
def test_the_s3_checkpoint_is_evaluated(scenario):
    evaluate = scenario["evaluate"]
    assert evaluate["exit_code"] == 0 and "table1.md" in evaluate["files"]
    [run] = _runs(scenario, "cluster-eval")
    ht_all = run["metrics"]["ht_all"]  # one run per model, the metrics under their own keys
    assert 0 <= ht_all <= 100


@pytest.mark.slow
def test_nothing_is_written_to_the_drivers_working_directory(scenario):
    assert scenario["cwd_files"] == []
    # Every run on the server; its artifacts in the bucket, not next to a database.
    for experiment in scenario["mlflow"].values():
        assert experiment["artifact_location"].startswith("mlflow-artifacts:")
