"""URIs to filesystems: a local path and `s3://bucket/key` go through the same code
(pyarrow filesystems, one S3 client per process), with an S3 endpoint override for MinIO,
moto or other S3 clones; output paths checked against Ray's temporary working dirs; local
copies of remote directories in a cache (checkpoints on s3:// for evaluation)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import shutil
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from csclip.errors import DataError

ENDPOINT_ENV = "AWS_ENDPOINT_URL"


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
        from csclip.cluster import ray_process

        where = ray_process()
        if where is not None:
            from csclip.errors import ConfigError

            raise ConfigError(f"{field}: {uri!r} is relative to the working directory of this Ray "
                              f"{where}, a temporary copy deleted with the Ray session; give an "
                              "s3:// URI (on a cluster) or an absolute path")
    return str(path.resolve())


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


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_dir(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.Directory


def list_files(fs: pafs.FileSystem, path: str, suffix: str = "") -> list[str]:
    """Sorted paths of the files directly under `path` ending in `suffix` ([] if none)."""
    if not exists(fs, path):
        return []
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(suffix))


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


def upload_dir(local: str | Path, uri: str) -> str:
    """Copy the files of the local directory `local` into `uri` (a local path or s3://),
    creating it; files already there under the same names are replaced. Returns `uri`.
    The one directory upload of the package: checkpoints' final/ and best/, reports."""
    fs, path = filesystem_for(uri)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(Path(local).resolve()), path, destination_filesystem=fs)
    return uri


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


def local_dir(uri: str, kind: str = "dirs") -> Path:
    """A local directory with the files of `uri`: the path itself when local; for s3:// a
    copy under cache_root()/<kind>/<hash of the URI>, downloaded once and again only when
    the remote listing (names, sizes, modification times) changed.

    Raises DataError when the remote directory is empty or missing.
    """
    if not is_s3(uri):
        return Path(filesystem_for(uri)[1])
    fs, path = filesystem_for(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    files = sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path)
    if not files:
        raise DataError(f"{uri}: no files there; check the URI (and the S3 endpoint and "
                        "credentials)")
    listing = [[posixpath.relpath(i.path, path), i.size, str(i.mtime)] for i in files]
    target = cache_root() / kind / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]
    expected = {"uri": uri, "files": listing}
    if _stamp(target) == expected:
        return target
    staging = target.with_name(f".tmp-{uuid.uuid4().hex}")
    staging.mkdir(parents=True)
    try:
        for (relative, _, _), info in zip(listing, files, strict=True):
            local = staging / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(read_bytes(fs, info.path))
        (staging / _LISTING_FILE).write_text(json.dumps(expected))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if _stamp(target) != expected:  # not another process that won the race
            raise
    return target


def _stamp(directory: Path) -> dict | None:
    path = directory / _LISTING_FILE
    return json.loads(path.read_text()) if path.is_file() else None
