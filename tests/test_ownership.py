"""Who may write an output (csclip.ownership): one live writer, a dead one's output taken
over by the same command with no file deleted by hand, and a refused run writing nothing
on storage; locally and on a local S3 server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from csclip import ownership
from csclip.config import load_config
from csclip.config.extract import ExtractConfig
from csclip.config.train import TrainConfig
from csclip.errors import ConfigError, DataError
from csclip.extract.pipeline import run_extraction
from csclip.ownership import LEASE_FILE, acquire_lease, output_lease, release_lease
from csclip.train import run
from tests.conftest import REPO_ROOT

BUCKET = "csclip-ownership"

_HOLDER = textwrap.dedent("""
    import sys, time
    from csclip.ownership import output_lease
    with output_lease(sys.argv[1], "a test writer"):
        print("held", flush=True)
        time.sleep(120)
""")


def _hold(uri: str, **env: str) -> subprocess.Popen:
    """A process that holds (and renews) the lease on `uri` until killed."""
    process = subprocess.Popen([sys.executable, "-c", _HOLDER, uri], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
    assert process.stdout.readline().strip() == "held"
    return process


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def _record(host: str = "a-node-that-was-lost", pid: int = 4242) -> bytes:
    return json.dumps({"what": "csclip extract", "pid": pid, "host": host,
                       "started": "2026-12-01T00:00:00Z", "token": "theirs"}).encode()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    from s3_helpers import fresh_bucket

    with fresh_bucket(s3_endpoint, monkeypatch, BUCKET,
                      CSCLIP_CACHE_DIR=str(tmp_path / "cache")) as client:
        yield client


def _keys(s3, prefix: str = "") -> list[str]:
    return [obj["Key"] for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
            .get("Contents", [])]


def _train_config(storage_path: str, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, [
        "model.image_size=32", "run.name=owned", f"run.storage_path={storage_path}",
        "tracking.enabled=false", *overrides])


def test_a_live_writer_is_refused_and_a_killed_one_taken_over(tmp_path):
    out = tmp_path / "eval"
    holder = _hold(str(out))
    try:
        with pytest.raises(DataError, match=f"being written by a test writer \\(pid {holder.pid}"):
            acquire_lease(str(out), "csclip evaluate")
    finally:
        _kill(holder)
    # SIGKILLed on this host: its pid is gone, so the lease is taken over at once.
    lease = acquire_lease(str(out), "csclip evaluate")
    saved = json.loads((out / LEASE_FILE).read_text())
    assert saved["pid"] == os.getpid() and saved["what"] == "csclip evaluate"
    release_lease(lease)
    assert not (out / LEASE_FILE).exists()


def test_a_lease_is_renewed_while_its_holder_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(ownership.TTL_ENV, "1")
    out = tmp_path / "out"
    holder = _hold(str(out), CSCLIP_LEASE_TTL_S="1")
    try:
        time.sleep(2.5)  # past the time to live: only renewal keeps it
        with pytest.raises(DataError, match="being written by a test writer"):
            acquire_lease(str(out), "a second writer")
    finally:
        _kill(holder)


def test_a_dead_owner_on_another_host_is_taken_over_once_its_lease_expires(tmp_path,
                                                                           monkeypatch):
    out = tmp_path / "extract"
    out.mkdir()
    (out / LEASE_FILE).write_bytes(_record())
    # Renewed just now (another host's pid cannot be checked from here): refused.
    with pytest.raises(DataError, match="a-node-that-was-lost"):
        acquire_lease(str(out), "csclip extract")
    # Not renewed for longer than the time to live: the same command takes it over.
    old = time.time() - ownership.lease_ttl() - 5
    os.utime(out / LEASE_FILE, (old, old))
    with output_lease(str(out), "csclip extract"):
        assert json.loads((out / LEASE_FILE).read_text())["host"] == socket.gethostname()
    assert not (out / LEASE_FILE).exists()


def test_the_same_extraction_resumes_an_output_whose_owner_died_elsewhere(tmp_path,
                                                                          ray_session):
    out = tmp_path / "units"
    config = load_config(ExtractConfig, None, [
        f"output.uri={out}", "tracking.enabled=false", "input.world.num_train=8",
        "input.world.num_val=0", "input.world.num_test=0", "output.shard_size=4"])
    out.mkdir()
    (out / LEASE_FILE).write_bytes(_record())
    old = time.time() - ownership.lease_ttl() - 5
    os.utime(out / LEASE_FILE, (old, old))
    summary = run_extraction(config)
    assert summary.read == 8 and summary.read == summary.with_units + summary.rejected
    assert not (out / LEASE_FILE).exists()
    # The run stored the config it ran with, which loads back as it was.
    stored = load_config(ExtractConfig, out / ownership.CONFIG_FILE)
    assert stored.output == config.output and stored.input.world == config.input.world


def test_the_holder_stores_its_resolved_config(tmp_path):
    config = _train_config(str(tmp_path / "runs"), "optim.lr=3e-6")
    with output_lease(str(tmp_path / "run"), "csclip train", config=config):
        assert load_config(TrainConfig, tmp_path / "run" / ownership.CONFIG_FILE) == config


def test_on_s3_creation_and_takeover_are_conditional_writes(s3, monkeypatch):
    uri = f"s3://{BUCKET}/runs/r"
    holder = _hold(uri)
    try:
        with pytest.raises(DataError, match=f"being written by a test writer \\(pid {holder.pid}"):
            acquire_lease(uri, "csclip train")
    finally:
        _kill(holder)
    # A record naming another host, not renewed for longer than the time to live.
    key = f"runs/other/{LEASE_FILE}"
    s3.put_object(Bucket=BUCKET, Key=key, Body=_record())
    with pytest.raises(DataError, match="a-node-that-was-lost"):
        acquire_lease(f"s3://{BUCKET}/runs/other", "csclip train")
    monkeypatch.setenv(ownership.TTL_ENV, "1")
    time.sleep(2.2)
    with output_lease(f"s3://{BUCKET}/runs/other", "csclip train"):
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert json.loads(body)["pid"] == os.getpid()
    assert key not in _keys(s3)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_refused_run_creates_nothing_on_storage(where, tmp_path, request):
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        storage_path, listing = f"s3://{BUCKET}/runs", lambda: _keys(s3)
    else:
        storage_path = str(tmp_path / "runs")
        listing = lambda: sorted(p.name for p in tmp_path.rglob("*"))  # noqa: E731
    before = listing()
    # A model name no config has: refused before the run's storage is touched.
    with pytest.raises(ConfigError, match="no-such-model"):
        run(_train_config(storage_path, "model.name=no-such-model"))
    # An extraction whose input is not there.
    with pytest.raises(DataError):
        run_extraction(load_config(ExtractConfig, None, [
            f"output.uri={storage_path}/units", "tracking.enabled=false",
            "backend.name=rules", f"input.uri={tmp_path / 'missing.txt'}"]))
    assert listing() == before
