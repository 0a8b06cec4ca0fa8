"""URIs to filesystems: a local path and `s3://bucket/key` go through the same code
(pyarrow filesystems), with an S3 endpoint override for MinIO, moto or other S3 clones."""

from __future__ import annotations

import os
import posixpath
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
    from the usual AWS environment variables / config files.
    """
    if is_s3(uri):
        endpoint = endpoint_url or os.environ.get(ENDPOINT_ENV) or None
        kwargs: dict = {}
        if endpoint:
            scheme, sep, rest = endpoint.partition("://")
            kwargs["endpoint_override"] = rest if sep else endpoint
            kwargs["scheme"] = scheme if sep else "https"
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs), uri[len("s3://"):].rstrip("/")
    if "://" in uri and not uri.startswith("file://"):
        raise DataError(f"unsupported URI scheme in {uri!r}; use a local path or s3://bucket/key")
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return pafs.LocalFileSystem(), str(Path(path).expanduser().absolute())


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


def delete_file(fs: pafs.FileSystem, path: str) -> None:
    if exists(fs, path):
        fs.delete_file(path)
