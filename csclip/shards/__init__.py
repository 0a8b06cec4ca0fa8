"""Webdataset shards: the img2dataset / webdataset layout csclip reads and writes.

A shard is a tar whose members are grouped into samples by key (`{key}.jpg`,
`{key}.txt`, `{key}.json`, ...). `layout` names the members and the index files,
`uris` expands brace patterns (`s3://bucket/laion/{00000..25599}.tar`) into shard URIs,
`read` iterates one shard's samples (the webdataset package's tar iteration).
"""

from csclip.shards.layout import (
    CAPTION_SUFFIXES,
    IMAGE_SUFFIXES,
    PIXELS_SUFFIX,
    SHARDS_MANIFEST,
    shard_stem,
    stats_name,
)
from csclip.shards.uris import expand_shards

__all__ = ["CAPTION_SUFFIXES", "IMAGE_SUFFIXES", "PIXELS_SUFFIX", "SHARDS_MANIFEST",
           "expand_shards", "shard_stem", "stats_name"]
