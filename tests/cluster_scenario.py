"""The multi-node scenario, run by tests/test_cluster.py in its own process (a
process joins one Ray only, and the test session already has its local one).

A simulated cluster on 127.0.0.1: a `ray.cluster_utils.Cluster` with a head and two worker
nodes, each worker advertising its own resource (`node_a`, `node_b`) and one unit of
`csclip_train`; a moto S3 server playing the bucket every node reaches (as an instance
profile gives on AWS); a real `mlflow server` (sqlite backend, artifacts on the bucket)
whose URL every node inherits as MLFLOW_TRACKING_URI (as cluster.yaml exports it before
`ray start`). On it, end to end:

  1. extraction with the rules backend from captions on s3:// to a units table on s3://;
  2. training with 2 workers, one per node (each takes the node's only csclip_train),
     each through a local shuffle buffer, 4 steps an epoch, checkpoints on s3:// every 3
     steps; rank 1's worker process is SIGKILLed after step 7, in the middle of the second
     epoch, and Ray Train restarts the group (max_failures=1), which resumes from the
     step-6 checkpoint on S3 (or the step-3 one: see test_cluster.py), trains the steps
     after it again and finishes step 8; every rank records its losses;
  3. the same training again, uninterrupted (storage in WORKDIR, no MLflow): every rank's
     losses after the restart must be this run's;
  4. evaluation of the s3:// checkpoint (pipelines/evaluate.py).

Ray Tune's sweep runs against a real head in tests/test_job_submit.py, its trials and
their resumption in tests/test_ablation.py: a sweep here would repeat them at the price of
minutes.

Run from an empty working directory; afterwards it must still be empty (caches go to
CSCLIP_CACHE_DIR). Writes what it saw as JSON to argv[1]; the test asserts on it.

    python tests/cluster_scenario.py RESULT.json WORKDIR
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_harness as harness  # noqa: E402

BUCKET = "csclip-cluster"
TINY = ["model.name=csclip-tiny", "model.image_size=32", "data.batch_size=4",
        "data.shuffle_buffer=8", "optim.warmup_steps=1", "optim.lr=1e-4",
        "run.checkpoint_every=3", "run.log_every=1", "run.num_workers=2",
        "run.worker_resources={csclip_train: 1}"]


def main(result_path: str, workdir: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("csclip").setLevel(logging.INFO)
    workdir_path = Path(workdir)
    result: dict = {"seconds": {}}
    started = time.monotonic()
    with harness.moto_s3(BUCKET) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        server_env = {**os.environ, "MLFLOW_S3_ENDPOINT_URL": endpoint}
        mlflow, mlflow_uri = harness.mlflow_server(workdir_path / "mlflow", server_env,
                                                   artifacts_destination=f"s3://{BUCKET}/mlflow")
        mlflow.start()  # boots while the captions go up and the cluster starts
        try:
            # Every node process inherits it, as cluster.yaml exports it before `ray start`.
            os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri
            upload_captions()
            run_on_cluster(result, workdir_path, mlflow.wait_ready)
            result["mlflow"] = mlflow_view(mlflow_uri)
            result["s3"] = s3_keys()
        finally:
            mlflow.stop()
    result["seconds"]["total"] = time.monotonic() - started
    result["cwd_files"] = harness.files_under(Path.cwd())
    Path(result_path).write_text(json.dumps(result, indent=1, default=str))
    return 0


def upload_captions() -> None:
    """World images as PNG objects and a JSONL of (image URI, caption, split): a COCO-like
    input whose images are read from S3 by whichever node needs them."""
    import boto3

    from csclip.config.world import WorldConfig
    from csclip.world import iter_world

    s3 = boto3.client("s3")
    lines = []
    world = WorldConfig(image_size=32, num_train=32, num_val=12, num_test=0)
    for record in iter_world(world, splits=("train", "val")):
        key = f"images/{record.image_id}.png"
        s3.put_object(Bucket=BUCKET, Key=key, Body=record.image_bytes)
        lines.append(json.dumps({"image": f"s3://{BUCKET}/{key}", "caption": record.caption,
                                 "split": record.split, "sample_id": record.sample_id}))
    s3.upload_fileobj(io.BytesIO("\n".join(lines).encode()), BUCKET, "captions.jsonl")


def run_on_cluster(result: dict, workdir: Path, servers_ready) -> None:
    import ray
    from ray.cluster_utils import Cluster

    # Logical CPUs are accounting only: few of them keep the number of worker processes
    # (each importing torch) small on a 2-core machine.
    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "object_store_memory": 200 * 1024**2})
    nodes = {name: cluster.add_node(num_cpus=2, resources={name: 1, "csclip_train": 1},
                                    object_store_memory=200 * 1024**2)
             for name in ("node_a", "node_b")}
    try:
        servers_ready()
        result["seconds"]["cluster_and_servers"] = time.monotonic() - started
        ray.init(address=cluster.address, configure_logging=False, log_to_driver=True)
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
        result["nodes"] = {name: node.node_id for name, node in nodes.items()}
        result["cluster_resources"] = dict(ray.cluster_resources())
        for step in (extract, train, train_reference, evaluate):
            tick = time.monotonic()
            result[step.__name__] = step(result, workdir)
            result["seconds"][step.__name__] = time.monotonic() - tick
    finally:
        ray.shutdown()
        cluster.shutdown()


def extract(result: dict, workdir: Path) -> dict:
    from csclip.config import load_config
    from csclip.config.extract import ExtractConfig
    from csclip.extract.pipeline import run_extraction

    config = load_config(ExtractConfig, None, [
        "input.format=jsonl", f"input.uri=s3://{BUCKET}/captions.jsonl", "backend.name=rules",
        f"output.uri=s3://{BUCKET}/extract", "output.shard_size=20",
        "tracking.experiment=cluster-extract"])
    summary = run_extraction(config)
    return {"read": summary.read, "with_units": summary.with_units, "rejected": summary.rejected,
            "units_uri": summary.units_uri, "mlflow_run_id": summary.mlflow_run_id}


def train(result: dict, workdir: Path) -> dict:
    from train_helpers import read_loss_log

    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.train.loop import WorkerHooks, run

    units = result["extract"]["units_uri"]
    config = load_config(TrainConfig, None, [
        *TINY, f"data.units_uri={units}", "optim.max_steps=8",
        "run.max_failures=1", f"run.storage_path=s3://{BUCKET}/runs", "run.name=two-nodes",
        "tracking.experiment=cluster-train"])
    losses = workdir / "losses" / "killed"
    outcome = run(config, hooks=WorkerHooks(fail_after_step=7, fail_by="sigkill", fail_rank=1,
                                            loss_log=str(losses)))
    import ray._private.state

    workers = [a for a in ray._private.state.actors().values()
               if a["ActorClassName"] == "RayTrainWorker"]
    return {"checkpoint_uri": outcome.checkpoint_uri, "step": outcome.metrics.get("step"),
            "resumed_from": outcome.metrics.get("resumed_from"),
            "mlflow_run_id": outcome.mlflow_run_id,
            "worker_nodes": sorted(a["Address"]["NodeID"] for a in workers),
            "split_coordinators": list(harness.split_coordinators().values()),
            "losses": read_loss_log(losses)}


def train_reference(result: dict, workdir: Path) -> dict:
    """`train`'s config, uninterrupted: what every rank's losses after the kill must be."""
    from train_helpers import read_loss_log

    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.train.loop import WorkerHooks, run

    config = load_config(TrainConfig, None, [
        *TINY, f"data.units_uri={result['extract']['units_uri']}", "optim.max_steps=8",
        f"run.storage_path={workdir / 'runs'}", "run.name=two-nodes-reference",
        "tracking.enabled=false"])
    losses = workdir / "losses" / "reference"
    outcome = run(config, hooks=WorkerHooks(loss_log=str(losses)))
    return {"step": outcome.metrics.get("step"), "losses": read_loss_log(losses)}


def evaluate(result: dict, workdir: Path) -> dict:
    sys.path.insert(0, str(harness.REPO_ROOT / "pipelines"))
    import evaluate as evaluate_entry

    code = evaluate_entry.main([
        "--checkpoint", result["train"]["checkpoint_uri"], "--units", result["extract"]["units_uri"],
        "--out", str(workdir / "eval"), "--set", "benchmark.num_bootstrap=10",
        "--set", "tracking.experiment=cluster-eval"])
    return {"exit_code": code, "files": harness.files_under(workdir / "eval")}


def mlflow_view(uri: str) -> dict:
    """What the tracking server holds: runs per experiment with their tags and metrics."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    view: dict = {}
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id])
        view[experiment.name] = {
            "artifact_location": experiment.artifact_location,
            "runs": [{"run_id": r.info.run_id, "status": r.info.status, "tags": r.data.tags,
                      "metrics": r.data.metrics,
                      # Every logged (step, loss), in logging order: a step logged
                      # again after a restart appears twice.
                      "loss_history": [(m.step, m.value) for m in
                                       client.get_metric_history(r.info.run_id, "loss")]
                      if "loss" in r.data.metrics else [],
                      "artifacts": [a.path for a in client.list_artifacts(r.info.run_id)]}
                     for r in runs]}
    return view


def s3_keys() -> list[str]:
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
