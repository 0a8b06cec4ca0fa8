"""Shared fixtures. Ray starts once per test session; pure-module tests never touch it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from mlflow_store import TEMPLATE_ENV, fresh_store
from s3_helpers import moto_server

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray Train's controller polls its workers every 2 s and acts (start, finish, restart) only
# on a poll: seconds of waiting per training run. A late poll is not a failure (it waits
# up to the 10-minute health-check timeout), so polling more often changes no outcome.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
# Ray Train starts an actor per worker group to watch for node preemption (spot
# instances): one more process importing ray.train and ray.data (~3 CPU-s) in every
# training run, and no test preempts a node.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


def pytest_configure(config) -> None:
    # Each test process gets its own: local copies of s3:// data go to a cache of this
    # test run only, not ~/.cache/csclip (shared with earlier runs and the user's own
    # work); one migrated MLflow store, copied for each test (tests/mlflow_store.py).
    # Under pytest-xdist the controller runs no tests and its environment is its
    # workers': it sets nothing, so that each worker makes its own.
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", 0):
        return
    os.environ.setdefault("CSCLIP_CACHE_DIR", tempfile.mkdtemp(prefix="csclip-test-cache-"))
    os.environ.setdefault(TEMPLATE_ENV, str(Path(tempfile.mkdtemp(prefix="csclip-test-mlflow-"))
                                            / "template.db"))


# `make test` runs the suite in two processes (pytest-xdist, --dist loadscope: a module
# runs whole in one of them, the modules in collection order). The longest modules go
# first, so the two processes end at about the same time; the rest keep their order.
# Measured in a serial run (`--durations`); a module missing here only runs later.
LONGEST_FIRST = ("test_job_submit.py", "test_vllm_engine.py", "test_cluster.py",
                 "test_demo.py", "test_quickstart.py", "test_ablation.py",
                 "test_train.py", "test_train_shards.py", "test_global_batch.py",
                 "test_eval_periodic.py", "test_laion_walkthrough.py", "test_extract_shards.py",
                 "test_cluster_head_env.py", "test_holdout.py")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept

# The same hypothesis examples on every run, so that a run's verdict does not depend on
# the draw; HYPOTHESIS_PROFILE=explore draws new examples each run (to look for bugs).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="module")
def s3_endpoint():
    """A local S3 server (moto in server mode) on 127.0.0.1, one per test module; a test
    makes its bucket on it with s3_helpers.fresh_bucket."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole test run (ray.init costs ~8 s)."""
    import ray

    if not ray.is_initialized():
        # address="local": a Ray of this process's own, always (a plain ray.init() joins
        # a running instance when it finds one recorded by `ray start`).
        ray.init(address="local", num_cpus=4, include_dashboard=False,
                 object_store_memory=300 * 1024**2, log_to_driver=False,
                 configure_logging=False)
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def sugarcrepe_dir() -> Path:
    path = SHARED_DATA / "sugarcrepe"
    if not path.is_dir():
        pytest.skip(f"SugarCrepe data not found at {path}")
    return path


@pytest.fixture
def mlflow_uri(tmp_path) -> str:
    """A real MLflow tracking store (sqlite) in the test's own directory, migrated already."""
    return f"sqlite:///{fresh_store(tmp_path / 'mlflow.db')}"
