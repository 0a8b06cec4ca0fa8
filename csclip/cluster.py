"""Where this process runs on a Ray cluster, and how big the cluster can get: whether we
are inside a submitted job or a Ray worker (whose working directory is temporary), and the
most resources the autoscaler may add (an autoscaling cluster starts with no GPUs)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

import yaml

# `ray job submit` sets this in the job's driver; the raylet sets RAY_JOB_ID in every worker
# process (tasks, actors, Train workers, Tune trials).
JOB_DRIVER_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
WORKER_ENV = "RAY_JOB_ID"
# `ray up` writes the autoscaler's config (node types with their resources filled in from
# the instance types) to this file on the head; job drivers run on the head.
AUTOSCALING_CONFIG = "~/ray_bootstrap_config.yaml"
AUTOSCALING_CONFIG_ENV = "CSCLIP_AUTOSCALING_CONFIG"


def ray_process() -> str | None:
    """Which Ray process this is: "job" (the driver of a submitted job), "worker" (a Ray
    worker process), or None (a plain process: a shell, pytest, `python script.py`)."""
    if os.environ.get(JOB_DRIVER_ENV):
        return "job"
    if os.environ.get(WORKER_ENV):
        return "worker"
    return None


def autoscaling_config(path: Path | None = None) -> dict | None:
    """The autoscaler's config on the head of a `ray up` cluster (or at
    $CSCLIP_AUTOSCALING_CONFIG), None elsewhere."""
    path = path or Path(os.environ.get(AUTOSCALING_CONFIG_ENV) or AUTOSCALING_CONFIG).expanduser()
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else None


def _node_counts(config: Mapping) -> dict[str, int]:
    # The head type counts once; every worker type up to its max_workers.
    head = config.get("head_node_type")
    return {name: 1 if name == head else int(node_type.get("max_workers", 0))
            for name, node_type in (config.get("available_node_types") or {}).items()}


def autoscaler_max_resources(config: Mapping) -> dict[str, float]:
    """The resources of the cluster at its largest: each node type's resources times its
    count (the head once, workers up to max_workers)."""
    total: dict[str, float] = {}
    for name, count in _node_counts(config).items():
        for resource, amount in (config["available_node_types"][name].get("resources") or {}).items():
            total[resource] = total.get(resource, 0.0) + count * float(amount)
    return total


def max_resources() -> dict[str, float]:
    """What the cluster can give at most: the autoscaler's maximum when this process runs
    on the head of a `ray up` cluster, else the resources present now (a fixed cluster).
    Ray must be initialised."""
    config = autoscaling_config()
    if config is not None:
        return autoscaler_max_resources(config)
    import ray  # noqa: PLC0415  ray only when asked: evaluation and the config checks run without it

    return dict(ray.cluster_resources())


def spans_nodes() -> bool:
    """True when work may run on more than one node: on the head of a `ray up` cluster whose
    autoscaler can add workers (whether or not Ray is initialised yet: Ray Train and Ray Data
    join that cluster on their own), or when this process's Ray has several nodes alive."""
    config = autoscaling_config()
    if config is not None and sum(_node_counts(config).values()) > 1:
        return True
    import ray  # noqa: PLC0415  as above: ray only when asked

    return ray.is_initialized() and sum(1 for node in ray.nodes() if node.get("Alive")) > 1


def training_worker_slots(resources: Mapping[str, float],
                          worker_resources: Mapping[str, float]) -> int | None:
    """How many training workers the custom resources of `run.worker_resources` admit at
    once (each worker takes `amount` of each), None when it names none.

    The GPUs of a cluster are not all training GPUs: on cluster.yaml the vLLM nodes' GPUs
    count in `GPU` too, but a training worker (which asks for `csclip_train`) never lands
    there; sized by `GPU` alone a sweep plans trials that wait for placement forever."""
    slots = [resources.get(name, 0.0) // amount for name, amount in worker_resources.items()
             if amount > 0]
    return int(min(slots)) if slots else None


# ---------------------------------------------------------------------------------------
# What cluster.yaml's nodes install (cluster/requirements.txt, made from pyproject.toml)
# ---------------------------------------------------------------------------------------

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
NODE_REQUIREMENTS = PYPROJECT.parent / "cluster" / "requirements.txt"
_REQUIREMENTS_HEADER = (
    "# What every node of cluster.yaml installs on top of its image: csclip's dependencies\n"
    "# and its `cluster` extra, from pyproject.toml. Made by `python -m csclip.cluster`;\n"
    "# tests/test_cluster_config.py fails when it is out of date.\n")


def node_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """csclip's dependencies plus the `cluster` extra (ray[default], boto3, what the
    `ray.data.llm` stages import, MLflow's auth app), in pyproject order."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["cluster"]]


def node_requirements_text(pyproject: Path = PYPROJECT) -> str:
    """cluster/requirements.txt as it should read."""
    return _REQUIREMENTS_HEADER + "".join(f"{line}\n" for line in node_requirements(pyproject))


if __name__ == "__main__":  # python -m csclip.cluster: rewrite cluster/requirements.txt
    NODE_REQUIREMENTS.write_text(node_requirements_text())
    print(f"wrote {NODE_REQUIREMENTS}")
