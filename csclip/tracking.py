"""MLflow helpers: resolve the tracking URI, open (or reopen, on resume) a run named after
the training run, log the resolved config as params, and buffer per-step metrics from the
rank-0 worker into batched writes."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from csclip.config import StrictModel

logger = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
RUN_NAME_TAG = "csclip.run_name"
# MLflow caps param values at 6000 characters and a batch at 100 params / 1000 metrics.
_MAX_PARAM_CHARS = 6000
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000


class TrackingConfig(StrictModel):
    """The `tracking` section: where MLflow runs go."""

    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment: str = "csclip"
    enabled: bool = True


def resolve_uri(uri: str | None) -> str:
    """The config's URI, else $MLFLOW_TRACKING_URI, else the local sqlite default.

    A relative sqlite path is made absolute: Ray workers run in another directory, and
    would otherwise write to a database of their own.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        uri = prefix + os.path.abspath(uri[len(prefix):])
    return uri


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(uri: str, name: str) -> str:
    client = _client(uri)
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


def open_run(config: TrackingConfig, run_name: str, params: Mapping[str, object],
             tags: Mapping[str, str] | None = None) -> str | None:
    """Return the id of the MLflow run tagged `run_name` in the experiment, creating it
    (with `params` logged) when there is none, so a resumed training run keeps logging to
    the same MLflow run. None when tracking is disabled."""
    if not config.enabled:
        return None
    from mlflow.entities import Param, RunTag

    uri = resolve_uri(config.uri)
    client = _client(uri)
    exp_id = experiment_id(uri, config.experiment)
    found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
                               max_results=1)
    if found:
        run_id = found[0].info.run_id
        if found[0].info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        return run_id
    run = client.create_run(exp_id, run_name=run_name,
                            tags={RUN_NAME_TAG: run_name, **(tags or {})})
    items = [Param(k, str(v)[:_MAX_PARAM_CHARS]) for k, v in sorted(params.items())]
    for start in range(0, len(items), _PARAMS_PER_BATCH):
        client.log_batch(run.info.run_id, params=items[start:start + _PARAMS_PER_BATCH])
    client.log_batch(run.info.run_id, tags=[RunTag("mlflow.source.type", "JOB")])
    return run.info.run_id


def finish_run(config: TrackingConfig, run_id: str | None, *, tags: Mapping[str, str] = (),
               metrics: Mapping[str, float] = (), status: str = "FINISHED") -> None:
    """Log final tags and metrics and close the run."""
    if run_id is None:
        return
    from mlflow.entities import Metric, RunTag

    client = _client(resolve_uri(config.uri))
    now = int(time.time() * 1000)
    client.log_batch(run_id,
                     metrics=[Metric(k, float(v), now, 0) for k, v in dict(metrics).items()],
                     tags=[RunTag(k, str(v)) for k, v in dict(tags).items()])
    client.set_terminated(run_id, status=status)


def log_artifact(config: TrackingConfig, run_id: str | None, path: str) -> None:
    if run_id is not None:
        _client(resolve_uri(config.uri)).log_artifact(run_id, path)


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
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        self._steps += 1
        if self._steps % self.flush_every == 0:
            self.flush()

    def flush(self) -> None:
        if self.run_id is None or not self._pending:
            return
        client = _client(resolve_uri(self.uri))
        for start in range(0, len(self._pending), _METRICS_PER_BATCH):
            client.log_batch(self.run_id, metrics=self._pending[start:start + _METRICS_PER_BATCH])
        self._pending = []


def run_metrics(uri: str | None, run_id: str, key: str) -> list[tuple[int, float]]:
    """The (step, value) history of one metric (for tests and reports)."""
    history = _client(resolve_uri(uri)).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)
