"""One live writer per output: a lease file in the output directory (local or s3://),
renewed while its holder runs and taken over once it expires.

A second writer of the same output is refused while the holder renews its lease; a holder
that died (a lost node, a killed driver, a stopped Tune trial) stops renewing, and the same
command run again takes the output over once the lease is older than its time to live
(at once when the holder was a process of this host that is gone). No file is ever deleted
by hand. Creation and takeover are atomic where the storage allows it: O_EXCL and a rename
locally, S3's conditional writes (If-None-Match to create, If-Match on the lease read to
take it over). The entry points take a lease only once the config and the inputs are
checked, so a refused run leaves nothing on storage."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path

import pyarrow.fs as pafs
from pydantic import BaseModel

from csclip.config import to_yaml
from csclip.errors import DataError
from csclip.storage import ENDPOINT_ENV, filesystem_for, join, write_bytes_atomic

__all__ = ["CONFIG_FILE", "LEASE_FILE", "TTL_ENV", "Lease", "acquire_lease", "lease_ttl", "output_lease",
           "release_lease"]

logger = logging.getLogger(__name__)

LEASE_FILE = ".csclip-lease.json"
CONFIG_FILE = "config.yaml"  # the resolved config of the run that writes the output
TTL_ENV = "CSCLIP_LEASE_TTL_S"  # seconds a lease lives without renewal (default 120)
DEFAULT_TTL_S = 120.0


def lease_ttl() -> float:
    """Seconds a lease stays valid after its last renewal ($CSCLIP_LEASE_TTL_S, else 120)."""
    try:
        return max(float(os.environ.get(TTL_ENV, DEFAULT_TTL_S)), 0.1)
    except ValueError as err:
        raise DataError(f"{TTL_ENV}={os.environ[TTL_ENV]!r} is not a number of seconds") from err


@dataclass
class Lease:
    """This process's hold on an output: the holder record in LEASE_FILE, and the thread
    that renews it."""

    uri: str
    holder: dict
    endpoint_url: str | None = None
    etag: str | None = None  # S3: the version of the lease this process wrote last
    stop: threading.Event = field(default_factory=threading.Event)


def _holder(what: str) -> dict:
    return {"what": what, "pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv)[:300], "token": uuid.uuid4().hex,
            "ray_job_id": os.environ.get("RAY_JOB_ID")}


def _describe(holder: dict) -> str:
    return (f"{holder.get('what', '?')} (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, since {holder.get('started', '?')})")


def _process_gone(holder: dict) -> bool:
    """Whether the holder was a process of this host that no longer runs."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


# -- the two storages: create exclusively, read (record, age, version), replace, delete ---

class _LocalLeases:
    def create(self, file: str, data: bytes) -> str | None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        return "created"

    def read(self, file: str) -> tuple[dict, float, str] | None:
        try:
            data, age = Path(file).read_bytes(), time.time() - os.stat(file).st_mtime
        except FileNotFoundError:
            return None
        return _record(data), age, ""

    def take_over(self, file: str, data: bytes, holder: dict, version: str) -> str | None:
        # A rename succeeds once: of two processes taking over, one moves it aside. What
        # was moved is checked: a lease another process took meanwhile goes back.
        aside = f"{file}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(file, aside)
        except FileNotFoundError:
            return None
        try:
            if _record(Path(aside).read_bytes()).get("token") != holder.get("token"):
                with contextlib.suppress(OSError):
                    os.link(aside, file)
                return None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(aside)
        return self.create(file, data)

    def renew(self, file: str, data: bytes, lease: Lease) -> bool:
        current = self.read(file)
        if current is None or current[0].get("token") != lease.holder["token"]:
            return False
        tmp = f"{file}.{uuid.uuid4().hex}.tmp"
        Path(tmp).write_bytes(data)
        os.replace(tmp, file)
        return True

    def delete(self, file: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(file)


class _S3Leases:
    def __init__(self, endpoint_url: str | None) -> None:
        import boto3  # noqa: PLC0415  boto3 is the cluster extra's; local outputs never need it
        from botocore.exceptions import ClientError  # noqa: PLC0415  as boto3

        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url or os.environ.get(ENDPOINT_ENV) or None)
        self.error = ClientError

    def _refused(self, err: Exception) -> bool:
        code = getattr(err, "response", {}).get("Error", {}).get("Code")
        return code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404")

    def _put(self, file: str, data: bytes, **condition) -> str | None:
        bucket, _, key = file.partition("/")
        try:
            return self.client.put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
        except self.error as err:
            if self._refused(err):
                return None
            raise

    def create(self, file: str, data: bytes) -> str | None:
        return self._put(file, data, IfNoneMatch="*")

    def read(self, file: str) -> tuple[dict, float, str] | None:
        bucket, _, key = file.partition("/")
        try:
            got = self.client.get_object(Bucket=bucket, Key=key)
        except self.error as err:
            if self._refused(err):
                return None
            raise
        # The age by the server's clock alone (its Date against the object's LastModified).
        date = got["ResponseMetadata"]["HTTPHeaders"].get("date")
        now = parsedate_to_datetime(date) if date else None
        age = (now - got["LastModified"]).total_seconds() if now else 0.0
        return _record(got["Body"].read()), age, got["ETag"]

    def take_over(self, file: str, data: bytes, holder: dict, version: str) -> str | None:
        return self._put(file, data, IfMatch=version)

    def renew(self, file: str, data: bytes, lease: Lease) -> bool:
        etag = self._put(file, data, IfMatch=lease.etag) if lease.etag else None
        if etag is None:
            return False
        lease.etag = etag
        return True

    def delete(self, file: str) -> None:
        bucket, _, key = file.partition("/")
        with contextlib.suppress(self.error):
            self.client.delete_object(Bucket=bucket, Key=key)


def _record(data: bytes) -> dict:
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _storage(uri: str, endpoint_url: str | None) -> tuple[_LocalLeases | _S3Leases, str]:
    fs, path = filesystem_for(uri, endpoint_url)
    store = _LocalLeases() if isinstance(fs, pafs.LocalFileSystem) else _S3Leases(endpoint_url)
    return store, join(path, LEASE_FILE)


def acquire_lease(uri: str, what: str, endpoint_url: str | None = None) -> Lease:
    """Take the lease on the output directory `uri` for this process, and renew it from a
    daemon thread until release_lease. Raises DataError naming the holder while another
    writer's lease is live."""
    store, file = _storage(uri, endpoint_url)
    lease = Lease(uri, _holder(what), endpoint_url)
    data = json.dumps(lease.holder, indent=1).encode()
    ttl = lease_ttl()
    for _ in range(5):  # a lease released or taken over meanwhile: look again
        version = store.create(file, data)
        if version is None:
            current = store.read(file)
            if current is None:
                continue
            holder, age, version_read = current
            if not (_process_gone(holder) or age > ttl):
                raise DataError(
                    f"{uri} is being written by {_describe(holder)}, whose lease was renewed "
                    f"{age:.0f} s ago; wait for it to finish, or write elsewhere (a writer "
                    f"that died is taken over {ttl:.0f} s after its last renewal: "
                    f"{TTL_ENV})")
            logger.warning("taking over %s from %s, which no longer renews it", file,
                           _describe(holder))
            version = store.take_over(file, data, holder, version_read)
            if version is None:
                continue
        lease.etag = version if isinstance(store, _S3Leases) else None
        _start_renewal(store, file, data, lease, ttl)
        return lease
    raise DataError(f"{uri}: could not take its lease {join(uri, LEASE_FILE)}; try again")


def _start_renewal(store: _LocalLeases | _S3Leases, file: str, data: bytes, lease: Lease,
                   ttl: float) -> None:
    def renew() -> None:
        while not lease.stop.wait(ttl / 4):
            try:
                if not store.renew(file, data, lease):
                    logger.error("the lease %s is no longer this process's: another writer "
                                 "took the output over", file)
                    return
            except Exception as err:  # storage unreachable for a while: try again
                logger.warning("could not renew the lease %s: %s", file, err)

    threading.Thread(target=renew, name="csclip-lease", daemon=True).start()


def release_lease(lease: Lease) -> None:
    """Stop renewing, and delete the lease when it is still this process's."""
    lease.stop.set()
    store, file = _storage(lease.uri, lease.endpoint_url)
    current = store.read(file)
    if current is not None and current[0].get("token") == lease.holder["token"]:
        store.delete(file)


@contextlib.contextmanager
def output_lease(uri: str, what: str, endpoint_url: str | None = None,
                 config: BaseModel | None = None) -> Iterator[Lease]:
    """Hold the lease on `uri` for the duration of the block (acquire_lease). With
    `config`, the holder first stores the resolved config as <uri>/config.yaml (what
    --print-config prints): every run says what it ran with."""
    lease = acquire_lease(uri, what, endpoint_url)
    try:
        if config is not None:
            fs, path = filesystem_for(uri, endpoint_url)
            write_bytes_atomic(fs, join(path, CONFIG_FILE), to_yaml(config).encode())
        yield lease
    finally:
        release_lease(lease)
