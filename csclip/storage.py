"""URIs to filesystems: a local path and `s3://bucket/key` go through the same code
(pyarrow filesystems, one S3 client per process), with an S3 endpoint override for MinIO,
moto or other S3 clones; output paths checked against Ray's temporary working dirs; local
copies of remote directories in a cache (checkpoints on s3:// for evaluation); directory
exports that a crash cannot leave half-written (a manifest of sizes and sha256, written
last). Who may write an output: csclip.ownership."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
import os
import posixpath
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.fs as pafs

from csclip.cluster import ray_process
from csclip.errors import ConfigError, DataError

ENDPOINT_ENV = "AWS_ENDPOINT_URL"
logger = logging.getLogger(__name__)


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def filesystem_for(uri: str, endpoint_url: str | None = None) -> tuple[pafs.FileSystem, str]:
    """Return (filesystem, path inside it) for a local path or an `s3://bucket/key` URI.

    endpoint_url: S3 endpoint (e.g. "http://127.0.0.1:9000"); defaults to the
    AWS_ENDPOINT_URL environment variable, then AWS itself. Credentials and region come
    from the usual AWS environment variables / config files (on EC2: the instance profile).
    One S3FileSystem per process and endpoint: a new one per call would repeat the
    credential lookup and the connection setup for every image read.
    """
    if is_s3(uri):
        endpoint = endpoint_url or os.environ.get(ENDPOINT_ENV) or None
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        # The key id is part of the key so that a process whose credentials change (tests
        # switching servers) does not keep a client signed with the old ones.
        return _s3_filesystem(endpoint, region, os.environ.get("AWS_ACCESS_KEY_ID")), \
            uri[len("s3://"):].rstrip("/")
    if "://" in uri and not uri.startswith("file://"):
        raise DataError(f"unsupported URI scheme in {uri!r}; use a local path or s3://bucket/key")
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return pafs.LocalFileSystem(), str(Path(path).expanduser().absolute())


@functools.lru_cache(maxsize=8)
def _s3_filesystem(endpoint: str | None, region: str | None, key_id: str | None) -> pafs.S3FileSystem:
    kwargs: dict = {}
    if endpoint:
        scheme, sep, rest = endpoint.partition("://")
        kwargs["endpoint_override"] = rest if sep else endpoint
        kwargs["scheme"] = scheme if sep else "https"
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)


def resolve_output(uri: str, field: str) -> str:
    """An output location (checkpoints, reports) made absolute. A relative local path inside
    a submitted Ray job or a Ray worker is refused: it would land in the job's temporary
    working directory, deleted with the Ray session.

    Raises ConfigError naming `field` for a relative path inside Ray.
    """
    if "://" in uri:
        return uri
    path = Path(uri).expanduser()
    if not path.is_absolute():
        where = ray_process()
        if where is not None:
            raise ConfigError(f"{field}: {uri!r} is relative to the working directory of this Ray "
                              f"{where}, a temporary copy deleted with the Ray session; give an "
                              "s3:// URI (on a cluster) or an absolute path")
    return str(path.resolve())


def inside_folder(relative: str) -> bool:
    """Whether a relative path from a data file stays inside the folder it is joined to
    (not absolute, not a URI, no `..` above it)."""
    if not relative or "://" in relative or relative.startswith(("/", "\\")):
        return False
    return not posixpath.normpath(relative.replace("\\", "/")).startswith("..")


def join(base: str, *parts: str) -> str:
    """Join path parts with "/" (valid for both local paths and S3 keys)."""
    return posixpath.join(base, *parts)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    """Read a whole file; a missing file is a DataError naming it."""
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError as err:
        raise DataError(f"file not found: {path}") from err
    except OSError as err:
        # pyarrow's S3 client reports a missing key as OSError with "NoSuchKey"/"Path does not exist".
        if "does not exist" in str(err) or "NoSuchKey" in str(err):
            raise DataError(f"file not found: {path}") from err
        raise


# A read that fails with a transient error (S3 throttling, a timeout, a reset connection)
# is tried again after 0.5, 1, 2, 4 s: 7.5 s in all, on top of the S3 client's own retries.
READ_ATTEMPTS = 5
READ_BACKOFF_S = 0.5


def read_bytes_retrying(fs: pafs.FileSystem, path: str, attempts: int = READ_ATTEMPTS,
                        backoff_s: float = READ_BACKOFF_S) -> bytes:
    """read_bytes with transient errors tried again, with exponential backoff. A missing
    file is a DataError at once (another try finds nothing either); the last attempt's
    OSError is raised when every attempt failed."""
    attempt = 1
    while True:
        try:
            return read_bytes(fs, path)
        except DataError:
            raise
        except OSError as err:
            if attempt >= attempts:
                raise
            delay = backoff_s * 2 ** (attempt - 1)
            logger.info("reading %s failed (%s); retrying in %.1f s", path, err, delay)
            time.sleep(delay)
            attempt += 1


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_dir(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.Directory


def list_files(fs: pafs.FileSystem, path: str, suffix: str = "") -> list[str]:
    """Sorted paths of the files directly under `path` ending in `suffix` ([] if none).
    Hidden files are left out: a write_bytes_atomic that a kill cut short leaves its
    `.tmp-...` file, empty or partial, beside the finished ones."""
    if not exists(fs, path):
        return []
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File
                  and i.path.endswith(suffix) and not posixpath.basename(i.path).startswith("."))


def write_bytes_atomic(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see either nothing or the whole file.

    Locally: write a hidden temporary file next to it, then rename (atomic on POSIX).
    On S3 a single PUT is already atomic, so the object is written directly.
    """
    parent = posixpath.dirname(path)
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(parent, recursive=True)
        tmp = join(parent, f".tmp-{uuid.uuid4().hex}-{posixpath.basename(path)}")
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
        return
    with fs.open_output_stream(path) as out:
        out.write(data)


def write_local_atomic(path: str | Path, data: bytes) -> None:
    """write_bytes_atomic for a local path."""
    write_bytes_atomic(pafs.LocalFileSystem(), str(Path(path).absolute()), data)


def upload_dir(local: str | Path, uri: str) -> str:
    """Copy the files of the local directory `local` into `uri` (a local path or s3://)
    so that a crash at any moment leaves nothing that verifies (check_export) but the
    whole directory. Returns `uri`. The one directory upload of the package: checkpoints'
    final/ and best/, reports.

    Locally the copy goes to a hidden sibling that is renamed into place (what was at
    `uri` is replaced as a whole). On S3, which has no rename, the old manifest is deleted
    first and the new one (MANIFEST_FILE: every file's size and sha256) is written last.
    """
    local = Path(local).resolve()
    manifest = json.dumps(manifest_of(local), indent=1, sort_keys=True).encode()
    fs, path = filesystem_for(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        _replace_local_dir(local, Path(path), manifest)
        return uri
    delete_file(fs, join(path, MANIFEST_FILE))
    fs.create_dir(path, recursive=True)
    files = [p for p in sorted(local.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda file: pafs.copy_files(
            str(file), join(path, file.relative_to(local).as_posix()),
            destination_filesystem=fs), files))
    write_bytes_atomic(fs, join(path, MANIFEST_FILE), manifest)
    return uri


def _replace_local_dir(local: Path, target: Path, manifest: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of an export killed earlier (one writer per run: csclip.storage leases).
    for stale in target.parent.glob(f".*-*-{glob.escape(target.name)}"):
        if stale.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(stale, ignore_errors=True)
    staging = target.with_name(f".tmp-{uuid.uuid4().hex}-{target.name}")
    shutil.copytree(local, staging, ignore=shutil.ignore_patterns(MANIFEST_FILE))
    (staging / MANIFEST_FILE).write_bytes(manifest)
    # rename() cannot replace a non-empty directory: the old one moves aside first. For a
    # moment there is none, which reads as "not finished", never as half-written.
    old = target.with_name(f".old-{uuid.uuid4().hex}-{target.name}") if target.exists() else None
    if old is not None:
        target.rename(old)
    staging.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Manifests: what makes a directory (a checkpoint, an export) complete
# ---------------------------------------------------------------------------------------

MANIFEST_FILE = "manifest.json"


def _sha256(stream) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def manifest_of(local: str | Path) -> dict:
    """{"files": {relative path: {"size", "sha256"}}} of every file under `local` (the
    manifest itself aside)."""
    local = Path(local)
    files = {}
    for file in sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST_FILE):
        with file.open("rb") as stream:
            files[file.relative_to(local).as_posix()] = {"size": file.stat().st_size,
                                                         "sha256": _sha256(stream)}
    return {"files": files}


def write_manifest(local: str | Path) -> None:
    """Write MANIFEST_FILE of the local directory `local`, last (atomically)."""
    data = json.dumps(manifest_of(local), indent=1, sort_keys=True).encode()
    write_local_atomic(Path(local) / MANIFEST_FILE, data)


def export_problem(fs: pafs.FileSystem, path: str, check_hashes: bool = False,
                   manifest: str = MANIFEST_FILE) -> str | None:
    """Why the directory at `path` is not a complete export (None when it is): no
    `manifest`, or a listed file missing, of another size or (check_hashes) other bytes."""
    file = join(path, manifest)
    if not exists(fs, file):
        return f"it has no {manifest}"
    try:
        entries = json.loads(read_bytes(fs, file))["files"]
        listed = [(str(name), int(entry["size"]), str(entry["sha256"]))
                  for name, entry in entries.items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"its {manifest} is unreadable"
    for name, size, sha256 in listed:
        if name.startswith("/") or ".." in name.split("/"):
            return f"its {manifest} lists {name!r}, outside the directory"
        info = fs.get_file_info(join(path, name))
        if info.type != pafs.FileType.File:
            return f"{name} is missing"
        if info.size != size:
            return f"{name} has {info.size} bytes, its manifest says {size}"
        if check_hashes:
            with fs.open_input_stream(join(path, name)) as stream:
                if _sha256(stream) != sha256:
                    return f"{name} differs from its manifest's sha256"
    return None


def check_export(uri: str | Path, check_hashes: bool = True, shown_as: str | None = None) -> None:
    """Raise DataError when the checkpoint directory `uri` is not complete (an export
    killed mid-way, or one written before csclip wrote manifests: rerunning the command
    that wrote it writes one). shown_as: the name in the message (an s3:// URI whose
    local copy `uri` is)."""
    fs, path = filesystem_for(str(uri))
    problem = export_problem(fs, path, check_hashes)
    if problem is not None:
        raise DataError(f"checkpoint {shown_as or uri} is incomplete (export interrupted?): "
                        f"rerun the same command ({problem})")


def delete_file(fs: pafs.FileSystem, path: str) -> None:
    if exists(fs, path):
        fs.delete_file(path)


# ---------------------------------------------------------------------------------------
# Local copies of remote directories (checkpoints on s3:// for evaluation)
# ---------------------------------------------------------------------------------------

CACHE_ENV = "CSCLIP_CACHE_DIR"
_LISTING_FILE = ".csclip-source.json"


def cache_root() -> Path:
    """$CSCLIP_CACHE_DIR, else $XDG_CACHE_HOME/csclip, else ~/.cache/csclip (never the
    working directory)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "csclip"


# A staging folder of local_dir older than this was left by a killed copy (a live one
# renames or removes its own within a copy's time), and is removed by the next copy.
STALE_STAGING_S = 3600


def local_dir(uri: str, kind: str = "dirs",
              check: Callable[[Callable[[str], bytes | None]], None] | None = None,
              max_bytes: int | None = None) -> Path:
    """A local directory with the files of `uri`: the path itself when local; for s3:// a
    copy under cache_root()/<kind>/<hash of the URI>, downloaded once and again only when
    the remote listing (names, sizes, modification times) changed.

    Whoever can write under `uri` chooses the keys: every key must name a file inside the
    copy (no absolute path, no empty, "." or ".." component), or nothing is copied.
    check: called before anything is downloaded with `read(relative name) -> bytes or None`
    (None: no such file); it raises to refuse the directory (load_bundle reads the model
    spec there, so a foreign prefix is refused before its weights are fetched).
    max_bytes: the most the copy may hold; a larger prefix is refused before anything is
    downloaded (a report's folder, not a bucket's root).

    Raises DataError when the remote directory is empty or missing, larger than
    max_bytes, or for a key that would land outside the copy.
    """
    if not is_s3(uri):
        return Path(filesystem_for(uri)[1])
    fs, path = filesystem_for(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    files = sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path)
    if not files:
        raise DataError(f"{uri}: no files there; check the URI (and the S3 endpoint and "
                        "credentials)")
    # Not posixpath.relpath: it normalizes "final/../../x" into a path that climbs out.
    listing = [[_key_inside(i.path, path, uri), i.size, str(i.mtime)] for i in files]
    total = sum(i.size or 0 for i in files)
    if max_bytes is not None and total > max_bytes:
        raise DataError(f"{uri}: {len(files)} files, {total / 2**20:.0f} MiB, more than the "
                        f"{max_bytes / 2**20:.0f} MiB this reads; give the folder itself, "
                        "not a prefix above it")
    target = cache_root() / kind / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]
    _remove_stale_staging(target.parent)
    expected = {"uri": uri, "files": listing}
    if _stamp(target) == expected:
        return target
    if check is not None:
        listed = {relative: info.path for (relative, _, _), info in zip(listing, files, strict=True)}
        check(lambda name: read_bytes(fs, listed[name]) if name in listed else None)
    staging = target.with_name(f".tmp-{uuid.uuid4().hex}")
    staging.mkdir(parents=True)
    root = staging.resolve()
    try:
        for (relative, _, _), info in zip(listing, files, strict=True):
            local = staging / relative
            if not local.resolve().is_relative_to(root):  # the lexical check, once more
                raise DataError(f"{uri}: key {info.path!r} resolves outside the local copy; "
                                "nothing copied")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(read_bytes(fs, info.path))
        (staging / _LISTING_FILE).write_text(json.dumps(expected))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except DataError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if _stamp(target) != expected:  # not another process that won the race
            raise
    return target


def _remove_stale_staging(folder: Path) -> None:
    """Remove the staging folders (`.tmp-*`) a killed local_dir left in `folder`."""
    if not folder.is_dir():
        return
    now = time.time()
    for staging in folder.glob(".tmp-*"):
        try:
            if now - staging.stat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(staging, ignore_errors=True)
        except FileNotFoundError:  # another process removed it
            continue


def _key_inside(key: str, prefix: str, uri: str) -> str:
    """`key` relative to `prefix`, refused (DataError naming it) unless every component
    is a plain name: a listing may hold "final/../../.bashrc" or "final//etc/x"."""
    relative = key[len(prefix) + 1:] if key.startswith(prefix + "/") else None
    parts = relative.split("/") if relative else [""]
    bad = next((part for part in parts if part in ("", ".", "..")), None)
    if relative is None or bad is not None or "\x00" in relative:
        reason = "not under the prefix" if relative is None else (
            "an absolute path or an empty component" if bad == "" else f"a {bad!r} component")
        raise DataError(f"{uri}: refusing to copy key {key!r} ({reason}): it would be written "
                        "outside the local copy; nothing copied")
    return relative


def _stamp(directory: Path) -> dict | None:
    path = directory / _LISTING_FILE
    return json.loads(path.read_text()) if path.is_file() else None
