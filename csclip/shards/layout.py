"""The names of a shard's members and of the files beside the shards.

Members (one sample = the members sharing a key, as img2dataset writes them):
- the image: `{key}.jpg|jpeg|png|webp` (encoded), or `{key}.pixels.npy`: the model's
  transformed (3, H, W) uint8 pixels, written once by `csclip shards --encoding pixels`
  (decode-once as a shard encoding; read with numpy, pickles refused);
- the caption: `{key}.txt`, else the `caption` field of `{key}.json`;
- metadata: `{key}.json` (img2dataset's: url, caption, width, ...; csclip's also
  sample_id, image_id, split and, for the synthetic world, its gold units).

Beside the shards: `{stem}_stats.json` per shard (img2dataset's name; `successes` is the
number of samples in the shard) and, from `csclip shards`, `shards.json` (every shard's
count, the encoding, the seed of the written order).
"""

from __future__ import annotations

import posixpath

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp")
PIXELS_SUFFIX = "pixels.npy"
CAPTION_SUFFIXES = ("txt", "json")
SHARDS_MANIFEST = "shards.json"


def shard_stem(uri: str) -> str:
    """`s3://b/laion/00042.tar` -> `00042`: the shard's name in per-shard outputs."""
    name = posixpath.basename(uri.rstrip("/"))
    return name[: -len(".tar")] if name.endswith(".tar") else name.rsplit(".", 1)[0]


def stats_name(uri: str) -> str:
    """The URI of a shard's img2dataset stats file, beside the shard."""
    return posixpath.join(posixpath.dirname(uri), f"{shard_stem(uri)}_stats.json")
