"""Starting Ray for an entry point: join a running cluster (RAY_ADDRESS or --address), or
start a local instance whose log holds no warning that a choice of ours causes.

The local instance is started the way Ray's defaults would start it, except:
- token authentication is decided, not defaulted (see LOCAL_ENV);
- every worker process learns its own cluster's address (`_worker_setup`), so Ray Train's
  placement-group cleaner queries this instance's state API instead of failing to choose
  among the other Ray instances on a shared machine;
- the dashboard, which serves that state API, is started (`include_dashboard=True`):
  without it the cleaner polls a missing API once a second and warns each time;
- Ray Data's console lines are kept to warnings (RAY_DATA_LOGGING).
Every worker of the job, local or on a cluster, starts with glibc's malloc told to reuse
what it frees (MALLOC_ENV, unless the user sets those variables).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import tempfile
from pathlib import Path

from csclip.cluster import ray_process

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]

# Set (when the user has not set them) before a local instance starts, so that the GCS,
# the raylet and every worker inherit them.
LOCAL_ENV = {
    # Ray >= 2.59 turns token authentication on for a new local instance and warns that
    # it did. We keep it on, explicitly: the local instance listens on this machine's
    # address and runs arbitrary code for whoever reaches it. The token lives in
    # ~/.ray/auth_token (created on first use). Export RAY_AUTH_MODE=disabled to opt out.
    "RAY_AUTH_MODE": "token",
    # The preemption watcher polls for spot-instance drain notices; a single local node
    # is never drained, and its actor's restart policy logs an error line at start.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Ray Train's controller polls its workers every 2 s and acts (a run's end, a restart)
    # only on a poll: up to 2 s of waiting at the end of every training run. A poll not
    # answered in time is not a failure (it waits up to the 10-minute health-check
    # timeout), so polling a local worker more often changes no outcome.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}


# glibc's malloc in every worker process (Ray Data's tasks decode and ship images, Train's
# workers normalise them): a map function runs in a thread of its worker, whose arena gave
# freed memory back to the kernel, so every image's buffers (a decoded 640x480 JPEG is
# 1.2 MB) were faulted in again for the next one. With the mmap threshold fixed at 32 MB
# (glibc's largest on 64-bit) and the trim threshold at 256 MB, freed memory is reused
# (docs/performance.md, tests/test_malloc.py); allocations of 32 MB and more are still
# mapped and unmapped. glibc reads these at a process's start; other C libraries ignore them.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
              "MALLOC_TRIM_THRESHOLD_": str(256 * 2**20)}


def worker_env_vars() -> dict[str, str]:
    """The runtime_env env_vars of the job's workers: MALLOC_ENV, or nothing where the
    user's environment sets either variable (their thresholds rule, as they set them)."""
    return {} if any(name in os.environ for name in MALLOC_ENV) else dict(MALLOC_ENV)


# Ray Data's default logging config (ray.data._internal.logging.DEFAULT_CONFIG) with the
# console at WARNING: its INFO lines ("Starting execution of Dataset ...", the progress
# blocks it logs every 10 s when stdout is not a terminal) would bury the step lines;
# ray-data.log in the session directory keeps everything. Ray Data reads the file named
# by RAY_DATA_LOGGING_CONFIG when it is imported, in every process.
RAY_DATA_LOGGING = """\
version: 1
disable_existing_loggers: false
formatters:
  ray:
    format: "%(asctime)s\\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"
filters:
  console_filter: {"()": ray.data._internal.logging.HiddenRecordFilter}
handlers:
  file:
    class: ray.data._internal.logging.SessionFileHandler
    formatter: ray
    filename: ray-data.log
  console:
    class: ray._private.log.PlainRayHandler
    formatter: ray
    level: WARNING
    filters: [console_filter]
loggers:
  ray.data:
    level: DEBUG
    handlers: [file, console]
    propagate: false
"""


def _ray_data_logging_file() -> str:
    """The logging YAML Ray Data reads in every process, in a directory only this user can
    write. Ray Data instantiates any `class:` the file names, so whoever could write it
    would run code in our workers: a shared /tmp path made first by another user (or left
    group/world writable) is never used; a fresh private directory is made instead."""
    directory = _private_dir(Path(tempfile.gettempdir()) / f"csclip-{os.getuid()}")
    path = directory / "ray_data_logging.yaml"
    if not path.is_file() or path.is_symlink() or path.read_text() != RAY_DATA_LOGGING:
        # Written aside and renamed: another process may be reading it right now.
        descriptor, staging = tempfile.mkstemp(prefix=".ray_data_logging-", dir=directory)
        with os.fdopen(descriptor, "w") as out:
            out.write(RAY_DATA_LOGGING)
        os.replace(staging, path)
    return str(path)


def _private_dir(path: Path) -> Path:
    """`path`, made 0700 if missing; used only if it is a real directory owned by this user
    that nobody else may write. Otherwise a new private directory (mkdtemp, 0700) beside
    it, with a warning naming what was wrong."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory (a link or a file)"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}"
    elif info.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    if problem is None:
        return path
    fresh = Path(tempfile.mkdtemp(prefix=f"csclip-{os.getuid()}-", dir=path.parent))
    logger.warning("%s %s: not used for Ray Data's logging config; using %s", path, problem,
                   fresh)
    return fresh


def _worker_setup() -> None:
    """Runs in every worker process of a local instance (runtime_env
    worker_process_setup_hook). Ray Train's PlacementGroupCleaner calls the state API with
    no address, which resolves RAY_ADDRESS or else looks for running GCS processes: on a
    machine where several engineers run Ray it finds many, raises ConnectionError in its
    monitor thread and prints the traceback. Point it at the worker's own instance."""
    import ray  # noqa: PLC0415  ray starts only after the config and inputs are checked

    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)


def local_env(num_cpus: int | None) -> dict[str, str]:
    """The environment a local instance starts with (its raylet, and every worker and
    actor it starts, inherit it): LOCAL_ENV, Ray Data's logging config and the raylet's
    startup concurrency. A variable already set keeps its value (init_ray)."""
    return {**LOCAL_ENV, "RAY_DATA_LOGGING_CONFIG": _ray_data_logging_file(),
            # The raylet starts at most this many worker processes at once (its default:
            # the number of cores) and warns once four times that many start together, as
            # two Train runs side by side do (csclip.demo.side_by_side).
            "RAY_worker_maximum_startup_concurrency": str(max(4, num_cpus or os.cpu_count() or 1))}


def prepare_ray_env(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """The environment Ray reads at its import and a local instance inherits (local_env),
    set before the first `import ray`: an entry point calls it before it imports its
    program (which may import ray at its top), init_ray again (a no-op then). Imported
    already (a library caller), Ray's own defaults apply."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not sys.stdout.isatty():
        # The driver prefixes each worker line with "(RayTrainWorker pid=...)" in color
        # codes, read when printed; in a log file they are noise.
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if not address and "ray" not in sys.modules:
        # Ray reads RAY_AUTH_MODE into its C++ config once, at import.
        for name, value in local_env(num_cpus).items():
            os.environ.setdefault(name, value)


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Connect to `address` (or RAY_ADDRESS), or start a local instance; True when a local
    instance was started here. Does nothing when Ray is already initialised.

    num_cpus: logical CPUs of a local instance (None: Ray's default, one per core). On
    2 cores that is one for the training worker and one for Ray Data's tasks; a Tune
    sweep needs more (tune/ablate.py passes max(4, cores)).
    """
    address = address or os.environ.get("RAY_ADDRESS")
    prepare_ray_env(address, num_cpus=num_cpus)
    import ray  # noqa: PLC0415  ray starts only after the config and inputs are checked

    if ray.is_initialized():
        return False
    if address:
        # Merged with a submitted job's own runtime_env (its env_vars are the driver's
        # environment already, so worker_env_vars leaves a user's thresholds alone).
        env_vars = worker_env_vars()
        runtime_env = {"env_vars": env_vars} if env_vars else {}

        if ray_process() is None:
            # A driver joining from outside a job ships the project directory to the
            # cluster's workers (.gitignore and .rayignore apply: no venv, runs or
            # databases), so they import this csclip, not whatever a node has installed.
            runtime_env.update(working_dir=str(REPO_ROOT), excludes=[".git"])
        ray.init(address=address, runtime_env=runtime_env or None, configure_logging=False)
        return False
    # A local instance's processes inherit this environment: the thresholds go there, not
    # into the job's runtime_env (whose env_vars keep Ray from reusing its prestarted
    # workers, so it starts more at once than the node's CPUs, and warns).
    for name, value in worker_env_vars().items():
        os.environ.setdefault(name, value)
    context = ray.init(num_cpus=num_cpus, include_dashboard=True,
                       configure_logging=False,
                       runtime_env={"worker_process_setup_hook": _worker_setup})
    logger.info("Ray: a local instance for this run; dashboard at http://%s",
                context.dashboard_url)
    return True
