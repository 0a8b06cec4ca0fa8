"""Webdataset shards: the img2dataset / webdataset layout csclip reads and writes.

A shard is a tar whose members are grouped into samples by key (`{key}.jpg`,
`{key}.txt`, `{key}.json`, ...). `layout` names the members and the index files,
`uris` expands brace patterns (`s3://bucket/laion/{00000..25599}.tar`) into shard URIs,
`read` iterates one shard's samples (the webdataset package's tar iteration), `write`
writes captions and their images as shards (`csclip shards`) and reads their manifest.
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
from csclip.shards.write import PixelEncoding, ShardsSummary, read_manifest, write_shards

__all__ = ["CAPTION_SUFFIXES", "IMAGE_SUFFIXES", "PIXELS_SUFFIX", "SHARDS_MANIFEST",
           "PixelEncoding", "ShardsSummary", "expand_shards", "read_manifest", "shard_stem",
           "stats_name", "write_shards"]
