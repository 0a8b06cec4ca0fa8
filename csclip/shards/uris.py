"""Shard URIs from brace patterns, as webdataset and img2dataset name them."""

from __future__ import annotations

import glob
import os

from braceexpand import braceexpand

from csclip.errors import DataError
from csclip.storage import is_s3


def expand_shards(patterns: str | list[str] | tuple[str, ...], *, check_local: bool = True
                  ) -> list[str]:
    """The shard URIs of one or more patterns, in pattern order, each once.

    `DIR/{000..009}.tar`, `s3://bucket/laion/{00000..25599}.tar` and several patterns
    separated by `::` (webdataset's convention) expand by brace expansion; a local
    pattern with `*` is globbed (sorted). Local paths come back absolute. With
    `check_local`, a local shard that does not exist is a DataError naming it (S3 shards
    are checked when read: listing 41k keys before starting would cost minutes).
    """
    if isinstance(patterns, str):
        patterns = patterns.split("::")
    uris: list[str] = []
    for pattern in patterns:
        for uri in braceexpand(pattern.strip()):
            if not is_s3(uri):
                path = uri[len("file://"):] if uri.startswith("file://") else uri
                path = os.path.abspath(os.path.expanduser(path))
                expanded = sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
                if check_local and not expanded:
                    raise DataError(f"no shard matches {uri!r}")
                uris.extend(expanded)
            else:
                uris.append(uri)
    if not uris:
        raise DataError(f"no shard in {list(patterns)!r}; give e.g. 'DIR/{{00000..00009}}.tar'")
    missing = [u for u in uris if check_local and not is_s3(u) and not os.path.isfile(u)]
    if missing:
        raise DataError(f"{len(missing)} of {len(uris)} shards do not exist, e.g. {missing[0]}")
    repeated = len(uris) - len(set(uris))
    if repeated:
        raise DataError(f"{repeated} shards are named twice in {list(patterns)!r}")
    return uris
