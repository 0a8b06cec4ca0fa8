"""Where runs and checkpoints go inside Ray: a submitted
job's working directory is a temporary copy, so a relative tracking store or output path is
refused there; MLFLOW_TRACKING_URI wins over the default everywhere, extraction included;
a store on one node's disk is refused when work spans nodes."""

from __future__ import annotations

import pytest
import yaml

from csclip import cluster, storage, tracking
from csclip.config import load_config
from csclip.errors import ConfigError

JOB_ENV = {cluster.JOB_DRIVER_ENV: '{"runtime_env": {}}'}


@pytest.fixture
def outside_ray(monkeypatch, tmp_path):
    for name in (cluster.JOB_DRIVER_ENV, cluster.WORKER_ENV, "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_default_store_is_refused_inside_a_submitted_job(outside_ray, monkeypatch):
    monkeypatch.setenv(cluster.JOB_DRIVER_ENV, JOB_ENV[cluster.JOB_DRIVER_ENV])
    with pytest.raises(ConfigError, match="temporary copy deleted with the Ray session; set "
                                          "MLFLOW_TRACKING_URI"):
        tracking.resolve_uri(None)
    with pytest.raises(ConfigError, match="Ray job"):
        tracking.resolve_uri("sqlite:///mlflow.db")


def test_relative_store_is_refused_in_a_ray_worker(outside_ray, monkeypatch):
    monkeypatch.setenv(cluster.WORKER_ENV, "01000000")
    with pytest.raises(ConfigError, match="Ray worker"):
        tracking.resolve_uri("sqlite:///runs/mlflow.db")


def test_tracking_uri_from_the_jobs_runtime_env_wins(outside_ray, monkeypatch):
    monkeypatch.setenv(cluster.JOB_DRIVER_ENV, JOB_ENV[cluster.JOB_DRIVER_ENV])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000")
    assert tracking.resolve_uri(None) == "http://10.0.0.5:5000"
    assert tracking.resolve_uri("sqlite:////data/mlflow.db") == "sqlite:////data/mlflow.db"


def test_outside_ray_the_local_default_is_an_absolute_path(outside_ray):
    assert tracking.resolve_uri(None) == f"sqlite:///{outside_ray}/mlflow.db"


def test_relative_output_paths_are_refused_inside_a_job(outside_ray, monkeypatch):
    from csclip.config.train import TrainConfig
    from csclip.train import storage_root

    assert storage.resolve_output("runs/train", "run.storage_path") == str(outside_ray / "runs/train")
    monkeypatch.setenv(cluster.JOB_DRIVER_ENV, JOB_ENV[cluster.JOB_DRIVER_ENV])
    assert storage.resolve_output("s3://b/runs", "run.storage_path") == "s3://b/runs"
    assert storage.resolve_output("/abs/runs", "run.storage_path") == "/abs/runs"
    with pytest.raises(ConfigError, match="run.storage_path: 'runs/train' is relative"):
        storage_root(TrainConfig())  # the default storage_path, as a job would run it


def test_extraction_logs_to_mlflow_tracking_uri(ray_session, outside_ray, monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from csclip.config.extract import ExtractConfig
    from csclip.extract.pipeline import run_extraction

    store = f"sqlite:///{tmp_path / 'server.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    config = load_config(ExtractConfig, None, [
        "input.world.num_train=3", "input.world.num_val=0", "input.world.num_test=0",
        f"output.uri={tmp_path / 'out'}"])
    summary = run_extraction(config)
    run = MlflowClient(store).get_run(summary.mlflow_run_id)
    assert run.data.metrics["read"] == 3 and run.info.status == "FINISHED"
    assert not (outside_ray / "mlflow.db").exists()


def test_extraction_in_a_job_refuses_a_relative_store_before_any_work(outside_ray, monkeypatch):
    from csclip.config.extract import ExtractConfig
    from csclip.extract.pipeline import run_extraction

    monkeypatch.setenv(cluster.JOB_DRIVER_ENV, JOB_ENV[cluster.JOB_DRIVER_ENV])
    out = outside_ray / "out"  # absolute, so the output check passes
    config = load_config(ExtractConfig, None, [f"output.uri={out}"])
    written = []
    with pytest.raises(ConfigError, match="MLflow tracking URI sqlite:///mlflow.db"):
        run_extraction(config, on_shard_written=written.append)
    # Refused before the first shard: the same error after the whole extraction (when its
    # MLflow run is logged) would be too late.
    assert written == []
    assert not [path for path in out.rglob("*") if path.is_file()]


def test_a_store_on_one_nodes_disk_is_refused_when_work_spans_nodes(ray_session, tmp_path,
                                                                    monkeypatch):
    sqlite = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.check_shared_store(sqlite, "training")  # one node, no autoscaler: fine
    # On the head of a `ray up` cluster the autoscaler can add workers: rank 0 may run
    # on another node with its own, empty file.
    config = tmp_path / "ray_bootstrap_config.yaml"
    config.write_text(yaml.safe_dump({"head_node_type": "head", "available_node_types": {
        "head": {"resources": {}}, "gpu": {"resources": {"GPU": 4}, "max_workers": 2}}}))
    monkeypatch.setenv(cluster.AUTOSCALING_CONFIG_ENV, str(config))
    with pytest.raises(ConfigError, match="training: MLflow tracking URI sqlite:.* is a file on "
                                          "this node"):
        tracking.check_shared_store(sqlite, "training")
    tracking.check_shared_store("http://10.0.0.5:5000", "training")
