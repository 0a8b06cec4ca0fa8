"""MLflow, in one place: resolve the tracking URI, find or create experiments (race-safe)
and runs (by tags, so a resumed job reopens its run; nested runs through the parent tag),
batched params and metrics, and per-step metrics buffered from the rank-0 worker. Every
module that logs goes through here (MlflowClient only: the fluent API's process-wide
active run is never touched)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

from csclip.cluster import ray_process, spans_nodes
from csclip.config.tracking import TrackingConfig
from csclip.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
RUN_NAME_TAG = "csclip.run_name"
# MLflow caps param values at 6000 characters and a batch at 100 params / 1000 metrics.
_MAX_PARAM_CHARS = 6000
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000




def resolve_uri(uri: str | None) -> str:
    """The tracking URI to log to: the config's `uri`, else $MLFLOW_TRACKING_URI (on a
    cluster, set by cluster.yaml on every node or by the job's runtime env), else the local
    default sqlite:///mlflow.db.

    A relative sqlite path is made absolute: Ray workers run in another directory and would
    otherwise write to a database of their own. Inside a submitted Ray job or a Ray worker
    it is refused instead: the working directory there is a temporary copy that Ray deletes
    with its session, so the runs would vanish.
    Raises ConfigError for a relative sqlite URI inside a Ray job or worker.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        where = ray_process()
        if where is not None:
            raise ConfigError(
                f"MLflow tracking URI {uri} is relative to the working directory of this Ray "
                f"{where}, a temporary copy deleted with the Ray session; set MLFLOW_TRACKING_URI "
                "(e.g. --runtime-env-json '{\"env_vars\": {\"MLFLOW_TRACKING_URI\": "
                "\"http://<head>:5000\"}}') or tracking.uri to a server or an absolute sqlite path")
        uri = prefix + os.path.abspath(uri[len(prefix):])
    return uri


def is_file_store(uri: str) -> bool:
    """A store that lives on one machine's disk (sqlite, file:, a plain path)."""
    return uri.startswith(("sqlite:", "file:", "/", "."))


def check_shared_store(uri: str, what: str) -> None:
    """Refuse a store on one node's disk when `what` runs on several nodes: a worker on
    another node (training's rank 0, a Tune trial) would open a different, empty file there.

    Raises ConfigError naming the URI and the fix. Needs Ray initialised (else no check).
    """
    if not is_file_store(uri):
        return

    if spans_nodes():
        raise ConfigError(
            f"{what}: MLflow tracking URI {uri} is a file on this node, but this Ray cluster "
            "has (or can add) other nodes whose workers would log to a file of their own; "
            "run an MLflow server every node reaches and set MLFLOW_TRACKING_URI to it "
            "(cluster.yaml starts one on the head: http://<head>:5000)")


PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for nested runs


def client(uri: str):
    """An MlflowClient for a resolved tracking URI."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415  mlflow loads only in runs that track (a second's import)

    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client, name: str) -> str:
    """The id of experiment `name`, created when missing. A sqlite store keeps artifacts
    next to its database (not in the caller's working directory); a parallel process that
    creates it first (another Tune trial) is not an error."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  as above: mlflow only in runs that track

    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    uri = str(mlflow_client.tracking_uri)
    location = None
    if uri.startswith("sqlite:///"):
        database = Path(uri[len("sqlite:///"):]).absolute()
        location = database.parent.joinpath("mlartifacts").as_uri()
    try:
        return mlflow_client.create_experiment(name, artifact_location=location)
    except MlflowException:
        found = mlflow_client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def find_run(mlflow_client, experiment: str, tags: Mapping[str, str]) -> str | None:
    """The id of a run of `experiment` carrying every one of `tags` (MLflow's own
    `mlflow.*` tags excepted), or None."""
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()
                         if not k.startswith("mlflow."))
    found = mlflow_client.search_runs([experiment], filter_string=query, max_results=1)
    return found[0].info.run_id if found else None


def find_or_create_run(mlflow_client, experiment: str, tags: Mapping[str, str],
                       run_name: str) -> str:
    """The run carrying all `tags` (reused, so a resumed job adds no duplicate run), else
    a new one with them; its status is set to RUNNING. A `PARENT_TAG` tag nests it."""
    run_id = find_run(mlflow_client, experiment, tags)
    if run_id is not None:
        mlflow_client.update_run(run_id, status="RUNNING")
        return run_id
    return mlflow_client.create_run(experiment, run_name=run_name, tags=dict(tags)).info.run_id


def log_params(mlflow_client, run_id: str, params: Mapping[str, object]) -> None:
    """Log params in batches (values cut to MLflow's 6000 characters)."""
    from mlflow.entities import Param  # noqa: PLC0415  mlflow only in runs that track

    items = [Param(k, str(v)[:_MAX_PARAM_CHARS]) for k, v in sorted(params.items())]
    for start in range(0, len(items), _PARAMS_PER_BATCH):
        mlflow_client.log_batch(run_id, params=items[start:start + _PARAMS_PER_BATCH])


def log_metrics(mlflow_client, run_id: str, metrics: Mapping[str, object], step: int = 0) -> None:
    """Log the finite numeric values of `metrics` at `step`, in batches (NaN, None, bools
    and strings are not metrics and are skipped)."""
    from mlflow.entities import Metric  # noqa: PLC0415  mlflow only in runs that track

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step) for k, v in metrics.items()
             if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    for start in range(0, len(items), _METRICS_PER_BATCH):
        mlflow_client.log_batch(run_id, metrics=items[start:start + _METRICS_PER_BATCH])


def open_run(config: TrackingConfig, run_name: str, params: Mapping[str, object],
             tags: Mapping[str, str] | None = None) -> str | None:
    """Return the id of the MLflow run tagged `run_name` in the experiment, creating it
    (with `params` logged) when there is none, so a resumed training run keeps logging to
    the same MLflow run. None when tracking is disabled."""
    if not config.enabled:
        return None
    mlflow_client = client(resolve_uri(config.uri))
    experiment = experiment_id(mlflow_client, config.experiment)
    run_id = find_run(mlflow_client, experiment, {RUN_NAME_TAG: run_name})
    if run_id is not None:
        mlflow_client.update_run(run_id, status="RUNNING")
        return run_id
    run_id = mlflow_client.create_run(experiment, run_name=run_name, tags={
        RUN_NAME_TAG: run_name, "mlflow.source.type": "JOB", **(tags or {})}).info.run_id
    log_params(mlflow_client, run_id, params)
    return run_id


def finish_run(config: TrackingConfig, run_id: str | None, *, tags: Mapping[str, str] = (),
               metrics: Mapping[str, float] = (), status: str = "FINISHED") -> None:
    """Log final tags and metrics and close the run."""
    if run_id is None:
        return
    from mlflow.entities import RunTag  # noqa: PLC0415  mlflow only in runs that track

    mlflow_client = client(resolve_uri(config.uri))
    log_metrics(mlflow_client, run_id, dict(metrics))
    mlflow_client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in dict(tags).items()])
    mlflow_client.set_terminated(run_id, status=status)


def log_artifact(config: TrackingConfig, run_id: str | None, path: str) -> None:
    if run_id is not None:
        client(resolve_uri(config.uri)).log_artifact(run_id, path)


class StepLogger:
    """Buffers per-step metrics and writes them in batches (one MLflow call per flush,
    not per metric: a sqlite write per value would cost more than a tiny model's step)."""

    def __init__(self, uri: str | None, run_id: str | None, flush_every: int = 10):
        self.uri, self.run_id, self.flush_every = uri, run_id, flush_every
        self._pending: list = []
        self._steps = 0

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import Metric  # noqa: PLC0415  mlflow only in runs that track

        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        self._steps += 1
        if self._steps % self.flush_every == 0:
            self.flush()

    def flush(self) -> None:
        if self.run_id is None or not self._pending:
            return
        mlflow_client = client(resolve_uri(self.uri))
        for start in range(0, len(self._pending), _METRICS_PER_BATCH):
            mlflow_client.log_batch(self.run_id, metrics=self._pending[start:start + _METRICS_PER_BATCH])
        self._pending = []


def run_metrics(uri: str | None, run_id: str, key: str) -> list[tuple[int, float]]:
    """The (step, value) history of one metric (for tests and reports)."""
    history = client(resolve_uri(uri)).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)
