"""cluster.yaml's setup, executed: for every node type, the file mounts laid out the way Ray
2.60's Docker command runner lays them, then the node's initialization, setup and start
commands run as a non-root user, in a sandbox directory, in the order Ray's NodeUpdater
runs them (ray/autoscaler/_private/updater.py: sync file mounts and cluster_synced_files,
initialization_commands on the host, `docker run`, setup commands in the container, start
commands). The commands come from Ray's own view of the config
(ray.autoscaler.v2.instance_manager.config.AutoscalingConfig: which setup commands a node
type runs, its docker config, its initialization commands).

What is real here: the file system, the owners and modes, the order, and the commands
themselves run by bash as a user who is not root. What stands in (and why):
- paths: the container's /home/ray and the host's /home/ubuntu and /tmp/ray_tmp_mount are
  directories under the sandbox root; each command has those prefixes rewritten to the
  sandbox's, and HOME points at the sandbox's /home/ray (there is no image here);
- `docker run -v src:dst`: dst becomes a symlink to src, its missing parents are made by
  root (Docker makes them as root), and a missing src is made by root too (as Docker
  does); ":ro" is not enforced;
- the SSH user on the host and `ray` in the container are one uid (both are uid 1000 on
  the AMI and in Ray's images); when the test runs as root it is uid 1000, else the
  user running the test, and "owned by root" is then a directory without write permission;
- rsync from the machine running `ray up`: that machine's user (this test's, who may be
  root in a checkout only root can read) reads the source into the sandbox, handed to the
  node's user; the node's user copies it from there, never from the checkout;
- `pip` (no network, no image): a script that checks that every file given with -r / -c
  is readable and records the call; `pip freeze` prints an image's pins;
- `ray` and `mlflow` in the start commands: scripts that record their arguments and the
  environment Ray would start with (token mode, token path, credentials) and check that the
  token file is readable.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from csclip import cluster

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO_ROOT / "cluster.yaml"
# The uid of `ray` in Ray's images and of `ubuntu` on the AMI.
IMAGE_UID = 1000
IMAGE_PINS = "ray==2.60.0\ntorch==2.13.0\ntorchvision==0.28.0\nvllm==0.29.0\ntransformers==5.24.0\n"

PIP_SHIM = """#!/bin/bash
# Stand-in for the image's pip: no network here. Checks what a real install would read.
echo "pip $*" >> "$SANDBOX_LOG"
if [ "$1" = freeze ]; then printf '%s' "$IMAGE_PINS"; exit 0; fi
if [ "$1" != install ]; then echo "pip shim: unexpected: $*" >&2; exit 2; fi
shift
while [ $# -gt 0 ]; do
  case "$1" in
    -r|-c) [ -r "$2" ] || { echo "pip: cannot read $2" >&2; exit 1; }
           echo "read $1 $2" >> "$SANDBOX_LOG"; cat "$2" >> "$SANDBOX_LOG"; shift 2;;
    *) shift;;
  esac
done
"""
START_SHIM = """#!/bin/bash
# Stand-in for `{name}`: records how it would start; the token must be readable.
echo "{name} $* | RAY_AUTH_MODE=$RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH \
MATCH=$RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL MLFLOW_USER=$MLFLOW_TRACKING_USERNAME \
MLFLOW_PASSWORD_SET=${{MLFLOW_TRACKING_PASSWORD:+yes}} \
ADMIN_PASSWORD_SET=${{MLFLOW_AUTH_ADMIN_PASSWORD:+yes}}" >> "$SANDBOX_LOG"
if [ "$1" = start ]; then
  [ "$RAY_AUTH_MODE" = token ] || {{ echo "ray start without RAY_AUTH_MODE=token" >&2; exit 1; }}
  [ -r "$RAY_AUTH_TOKEN_PATH" ] && [ -s "$RAY_AUTH_TOKEN_PATH" ] || {{
    echo "no token at $RAY_AUTH_TOKEN_PATH" >&2; exit 1; }}
fi
"""


@dataclass
class Sandbox:
    """A temporary root with a host and a container side for one node."""

    root: Path
    uid: int
    gid: int
    as_root: bool
    log: Path = field(init=False)
    locked: list[Path] = field(default_factory=list)

    def __post_init__(self):
        self.log = self.root / "log.txt"
        self.uploads = 0
        self.host = self.root / "host"
        self.ctr = self.root / "ctr"
        self.bin = self.root / "bin"
        for directory in (self.host / "home" / "ubuntu", self.host / "tmp",
                          self.ctr / "home" / "ray", self.bin):
            directory.mkdir(parents=True)
        self.chown(self.host / "home" / "ubuntu")
        self.chown(self.ctr / "home" / "ray")
        self.chown(self.host / "tmp")
        self.log.touch()
        self.chown(self.log)
        (self.bin / "pip").write_text(PIP_SHIM)
        for name in ("ray", "mlflow"):
            (self.bin / name).write_text(START_SHIM.format(name=name))
        for shim in self.bin.iterdir():
            shim.chmod(0o755)
        # python: the setup commands use only the standard library; any Python 3 the
        # node's user may run will do (this test's own may be in root's home).
        (self.bin / "python").symlink_to(self._user_python())

    def _user_python(self) -> str:
        candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
        kwargs = {"user": self.uid, "group": self.gid, "extra_groups": []} if self.as_root else {}
        for candidate in candidates:
            try:
                if subprocess.run([candidate, "-c", "import secrets"], cwd="/",
                                  capture_output=True, **kwargs).returncode == 0:
                    return candidate
            except OSError:  # missing, or not the user's to run
                continue
        pytest.skip("no Python the sandbox's user may run")

    def chown(self, path: Path) -> None:
        if self.as_root:
            os.chown(path, self.uid, self.gid)

    def upload(self, source: Path) -> Path:
        """What `ray up` sends of `source`: read by this process (the local side of rsync,
        whose user can read its own checkout even under a 0700 directory, where the node's
        uid 1000 cannot), laid down in the sandbox with its modes and owned by the node's
        user (the remote side of rsync writes as the SSH user)."""
        self.uploads += 1
        staged = self.root / "upload" / f"{self.uploads}-{source.name}"
        staged.parent.mkdir(exist_ok=True)
        staged.parent.chmod(0o755)  # the node's user must reach it, whatever the umask
        if source.is_dir():
            shutil.copytree(source, staged, symlinks=True)
            paths = [staged, *staged.rglob("*")]
        else:
            shutil.copy2(source, staged)
            paths = [staged]
        if self.as_root:
            for path in paths:
                os.lchown(path, self.uid, self.gid)
        return staged

    def host_path(self, path: str) -> Path:
        return self.host / path.lstrip("/")

    def ctr_path(self, path: str) -> Path:
        return self.ctr / path.lstrip("/")

    def translate(self, command: str) -> str:
        # One pass, so that a path already rewritten is not rewritten again; a prefix
        # counts only at the start of a path (not inside another one).
        places = {"/tmp/ray_tmp_mount": self.host / "tmp" / "ray_tmp_mount",
                  "/home/ubuntu": self.host / "home" / "ubuntu",
                  "/home/ray": self.ctr / "home" / "ray"}
        pattern = r"(?<![\w/.-])(" + "|".join(map(re.escape, places)) + r")(?![\w.-])"
        return re.sub(pattern, lambda match: str(places[match.group(1)]), command)

    def make_root_dir(self, path: Path) -> None:
        """A directory as Docker makes it: owned by root, not writable by the user (made
        read-only by lock() when the test does not run as root)."""
        path.mkdir()
        if not self.as_root:
            self.locked.append(path)

    def lock(self) -> None:
        for path in reversed(self.locked):
            path.chmod(0o555)
        self.locked.clear()

    def run(self, command: str, home: Path, env: dict[str, str] | None = None,
            translate: bool = True) -> None:
        """One command, as the node's user, through bash; raises with its output.
        translate: rewrite the node's paths to the sandbox's (False for the sandbox's own
        file operations, whose paths are the sandbox's already)."""
        environment = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(home),
                       "SANDBOX_LOG": str(self.log), "IMAGE_PINS": IMAGE_PINS,
                       "LANG": "C.UTF-8", **(env or {})}
        kwargs = {"user": self.uid, "group": self.gid, "extra_groups": []} if self.as_root else {}
        done = subprocess.run(["bash", "-c", self.translate(command) if translate else command],
                              cwd=home, env=environment,
                              capture_output=True, text=True, timeout=60, **kwargs)
        if done.returncode != 0:
            raise SetupFailed(f"{command!r} exited {done.returncode}: {done.stderr.strip()}")

    def unlock(self) -> None:
        for path, dirs, _ in os.walk(self.root):
            for name in dirs:
                target = Path(path) / name
                if not target.is_symlink():
                    target.chmod(target.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)


class SetupFailed(RuntimeError):
    pass


def _sandbox() -> Sandbox:
    as_root = os.geteuid() == 0
    root = Path(tempfile.mkdtemp(prefix="csclip-setup-", dir="/tmp"))
    root.chmod(0o755)  # the node's user must reach it
    uid, gid = (IMAGE_UID, IMAGE_UID) if as_root else (os.getuid(), os.getgid())
    return Sandbox(root, uid, gid, as_root)


def rsync_up(box: Sandbox, source: Path, cluster_name: str, target: str) -> None:
    """DockerCommandRunner.run_rsync_up with docker_mount_if_possible (what file mounts and
    cluster_synced_files use): `mkdir -p <dirname> && chown -R <ssh user>` under
    /tmp/ray_tmp_mount/<cluster>/ on the host, then rsync as the SSH user. Into the
    container only through the bind mounts of `docker run`."""
    source = box.upload(source)
    destination = box.host_path(f"/tmp/ray_tmp_mount/{cluster_name}/{target.lstrip('/')}")
    home = box.host_path("/home/ubuntu")
    box.run(f"mkdir -p {destination.parent}", home=home, translate=False)
    if source.is_dir():
        box.run(f"mkdir -p {destination} && cp -rp {source}/. {destination}/", home=home,
                translate=False)
    else:
        box.run(f"cp -p {source} {destination}", home=home, translate=False)


def bind(box: Sandbox, source: Path, target: str) -> None:
    """`docker run -v source:target`: missing parents of the target, and a missing
    source, are made by root."""
    if not source.exists():
        _make_parents_as_root(box, source.parent, box.root)
        box.make_root_dir(source)
    destination = box.ctr_path(target)
    _make_parents_as_root(box, destination.parent, box.ctr)
    if destination.is_symlink():  # the container of an earlier `ray up` on this node
        destination.unlink()
    destination.symlink_to(source)


def _make_parents_as_root(box: Sandbox, path: Path, top: Path) -> None:
    missing = []
    while not path.exists() and path != top:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        box.make_root_dir(directory)


def run_node(box: Sandbox, config: dict, node_type: str, local_root: Path,
             head_secrets: dict[str, Path] | None = None) -> None:
    """Bring up one node of `node_type` in `box` as Ray's NodeUpdater would."""
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    ray_view = AutoscalingConfig(config, skip_content_hash=True)
    raw = ray_view.get_raw_config_mutable()
    name = raw["cluster_name"]
    is_head = node_type == ray_view.get_head_node_type()
    docker = ray_view.get_docker_config(node_type)
    host_home = box.host_path("/home/ubuntu")
    ctr_home = box.ctr_path("/home/ray")
    # 1. File mounts (from the machine running `ray up` for the head; for a worker from
    # the head, which has the same paths), then, on workers only, cluster_synced_files
    # from the head (updater.py: skipped when missing there).
    for target, source in raw["file_mounts"].items():
        rsync_up(box, (local_root / source).resolve(), name, target)
    if not is_head:
        for path in raw.get("cluster_synced_files", []):
            if head_secrets and path in head_secrets and head_secrets[path].exists():
                rsync_up(box, head_secrets[path], name, path)
    # 2. initialization_commands, on the host as the SSH user.
    for command in ray_view.get_initialization_commands(node_type):
        box.run(command, home=host_home)
    # 3. docker run: the file mounts bound at their targets, then run_options' -v binds.
    for target in raw["file_mounts"]:
        bind(box, box.host_path(f"/tmp/ray_tmp_mount/{name}/{target.lstrip('/')}"), target)
    run_options = docker.get("run_options", []) + \
        docker.get("head_run_options" if is_head else "worker_run_options", [])
    for option in run_options:
        if option.startswith("-v "):
            source, target = option[3:].split(":")[:2]
            bind(box, Path(box.translate(source)), target)
    box.lock()
    # 4. setup commands, then 5. start commands, in the container as `ray`.
    setup = ray_view.get_head_setup_commands() if is_head else \
        ray_view.get_worker_setup_commands(node_type)
    start = ray_view.get_head_start_ray_commands() if is_head else \
        ray_view.get_worker_start_ray_commands()
    for command in [*setup, *start]:
        # What the updater exports before worker start commands (with_envs).
        env = {} if is_head else {"RAY_HEAD_IP": "10.0.0.1"}
        box.run(command, home=ctr_home, env=env)


def _config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


@pytest.fixture(scope="module")
def head_box():
    box = _sandbox()
    try:
        run_node(box, _config(), "head", REPO_ROOT)
        yield box
    finally:
        box.unlock()
        shutil.rmtree(box.root, ignore_errors=True)


def _log_with(box: Sandbox, text: str, timeout_s: float = 10) -> str:
    import time

    deadline = time.monotonic() + timeout_s
    while text not in (log := box.log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return log


def _secrets_of(head: Sandbox) -> dict[str, Path]:
    return {path: head.ctr_path(path).resolve() for path in _config()["cluster_synced_files"]}


def test_head_setup_makes_the_secrets_on_the_head_only(head_box):
    secrets = head_box.ctr_path("/home/ray/csclip-secrets")
    # The container's path is the host's directory (head_run_options), made by the SSH user.
    assert secrets.resolve() == head_box.host_path("/home/ubuntu/csclip-secrets")
    assert secrets.resolve().stat().st_uid == head_box.uid
    assert stat.S_IMODE(secrets.resolve().stat().st_mode) == 0o700
    # What the workers get (synced): the token and the jobs' MLflow password; the MLflow
    # admin's password and session key stay in the head's own MLflow directory.
    head_only = head_box.ctr_path("/home/ray/mlflow")
    assert sorted(p.name for p in secrets.iterdir()) == ["mlflow-jobs-password", "ray-token"]
    for path in (secrets / "ray-token", secrets / "mlflow-jobs-password",
                 head_only / "admin-password", head_only / "flask-secret"):
        assert len(path.read_text()) == 64 and int(path.read_text(), 16) >= 0  # 256-bit hex
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    log = _log_with(head_box, "mlflow server")  # started in the background
    assert "read -r " in log and cluster.node_requirements_text() in log
    assert "mlflow server --app-name basic-auth" in log
    assert "ray start --head" in log and "RAY_AUTH_MODE=token" in log
    assert "MATCH=minor" in log and "MLFLOW_PASSWORD_SET=yes" in log
    assert "ADMIN_PASSWORD_SET=yes" in log and "MLFLOW_USER=csclip-jobs" in log


def test_a_second_head_setup_keeps_the_secrets(head_box):
    token = (head_box.ctr_path("/home/ray/csclip-secrets") / "ray-token").read_text()
    run_node(head_box, _config(), "head", REPO_ROOT)  # `ray up` again on the same disk
    assert (head_box.ctr_path("/home/ray/csclip-secrets") / "ray-token").read_text() == token


@pytest.mark.parametrize("node_type", ["cpu_worker", "gpu_train", "vllm_worker"])
def test_worker_setup_runs_as_the_image_user_and_gets_the_heads_token(head_box, node_type):
    box = _sandbox()
    try:
        run_node(box, _config(), node_type, REPO_ROOT, head_secrets=_secrets_of(head_box))
        token = box.ctr_path("/home/ray/csclip-secrets/ray-token")
        assert token.read_text() == head_box.ctr_path("/home/ray/csclip-secrets/ray-token").read_text()
        log = box.log.read_text()
        assert cluster.node_requirements_text() in log  # what pip was given to install
        assert "ray start --address=10.0.0.1:6379" in log and "RAY_AUTH_MODE=token" in log
        assert "MATCH=minor" in log and "MLFLOW_PASSWORD_SET=yes" in log
        if node_type == "vllm_worker":  # constrained to the image's builds
            assert "read -c " in log and "vllm==0.29.0" in log
        # Nothing was written into the mount (its files are the project's, unchanged).
        mount = box.ctr_path("/home/ray/csclip")
        assert sorted(p.name for p in mount.iterdir()) == \
            sorted(p.name for p in (REPO_ROOT / "cluster").iterdir())
    finally:
        box.unlock()
        shutil.rmtree(box.root, ignore_errors=True)


def test_the_sandbox_refuses_what_failed_on_aws(tmp_path):
    # The layout that broke `ray up` on every node: a single file mounted under a
    # directory that is not in the image, and setup writing next to it. Docker makes
    # /home/ray/csclip as root, so the image's user gets "Permission denied".
    local = tmp_path / "project"
    local.mkdir()
    (local / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    config = _config()
    config["file_mounts"] = {"/home/ray/csclip/pyproject.toml": "./pyproject.toml"}
    config.pop("cluster_synced_files")
    config["setup_commands"] = ["cp /home/ray/csclip/pyproject.toml /home/ray/csclip/requirements.txt"]
    config["head_setup_commands"] = []
    config["head_start_ray_commands"] = []
    box = _sandbox()
    try:
        # The setup's own write is refused (not the upload: tmp_path is 0700 under root).
        with pytest.raises(SetupFailed, match="requirements.txt.*Permission denied"):
            run_node(box, config, "head", local)
    finally:
        box.unlock()
        shutil.rmtree(box.root, ignore_errors=True)


def test_head_setup_from_a_checkout_in_a_private_directory(tmp_path):
    # A clone in a directory only its owner can read (`mktemp -d`, anything under /root):
    # run as root, the node's user (uid 1000) cannot read it, yet `ray up` works, since
    # rsync reads the checkout as the local user. Not root, the node's user is the one
    # running the test and this only checks the copy.
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    config = _config()
    for source in config["file_mounts"].values():
        (shutil.copytree if (REPO_ROOT / source).is_dir() else shutil.copy2)(
            REPO_ROOT / source, private / source)
    box = _sandbox()
    try:
        run_node(box, config, "head", private)
        mount = box.ctr_path("/home/ray/csclip")
        for path in (REPO_ROOT / "cluster").iterdir():
            assert (mount / path.name).read_bytes() == path.read_bytes(), path.name
        assert (box.ctr_path("/home/ray/csclip-secrets") / "ray-token").stat().st_size == 64
    finally:
        box.unlock()
        shutil.rmtree(box.root, ignore_errors=True)


def test_node_requirements_file_is_made_from_pyproject():
    assert cluster.NODE_REQUIREMENTS.read_text() == cluster.node_requirements_text(), \
        "cluster/requirements.txt is out of date: run `python -m csclip.cluster`"
    requirements = cluster.node_requirements()
    assert any(r.startswith("transformers") for r in requirements)
    assert any(r.startswith("mlflow[auth]") for r in requirements)
