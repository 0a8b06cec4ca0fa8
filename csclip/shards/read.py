"""One shard's samples, as webdataset groups them.

The tar format is read by the standard library's `tarfile` (streaming, `r|*`: one pass,
no seeks, so an S3 object is read once from its start); members are grouped into samples
by webdataset's rule (the key is the member's name up to the first dot of its base name;
tests/test_eval_shards.py checks the grouping against webdataset's own `group_by_keys`).
The webdataset package imports torch, which the data tasks never need.

Nothing here raises on bad data: a sample without image or caption (where one is
required), an unreadable JSON, a repeated member, a shard cut short are each a
`ShardSample` with `reject` set to the reason, so that a reader counts them (read = kept +
rejected) and goes on.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections.abc import Collection, Container, Iterator, Sequence
from dataclasses import dataclass, field

from csclip.errors import DataError
from csclip.shards.layout import IMAGE_SUFFIXES, PIXELS_SUFFIX
from csclip.storage import filesystem_for

# The reasons a sample is rejected (ShardSample.reject).
NO_CAPTION = "no_caption"
NO_IMAGE = "no_image"
BAD_JSON = "bad_json"
REPEATED_MEMBER = "repeated_member"
REPEATED_KEY = "repeated_key"
TRUNCATED_SHARD = "truncated_shard"
UNREADABLE_SHARD = "unreadable_shard"

# The image members a sample is read from, the first one it has: decoded pixels first.
DEFAULT_IMAGE_SUFFIXES: tuple[str, ...] = (PIXELS_SUFFIX, *IMAGE_SUFFIXES)


@dataclass
class ShardSample:
    """One sample of a shard. `image` is the encoded image's bytes (`image_suffix`: jpg,
    png, webp) or, for `pixels.npy`, the .npy file's bytes; `meta` is `{key}.json`;
    `members` the bytes of the other members iter_shard was asked to keep (suffix ->
    bytes, e.g. CLIP_benchmark's `cls`), those the sample has."""

    shard: str
    key: str
    caption: str | None = None
    image: bytes | None = None
    image_suffix: str | None = None
    meta: dict = field(default_factory=dict)
    reject: str | None = None
    detail: str | None = None
    members: dict[str, bytes] = field(default_factory=dict)


def split_member(name: str) -> tuple[str, str] | None:
    """(key, suffix) of a member name by webdataset's rule, None for a directory-less
    dotless name. `a/b/000.jpg` -> (`a/b/000`, `jpg`); `000.pixels.npy` -> (`000`,
    `pixels.npy`)."""
    directory, base = posixpath.split(name)
    if "." not in base:
        return None
    stem, suffix = base.split(".", 1)
    return posixpath.join(directory, stem) if directory else stem, suffix.lower()


@dataclass(frozen=True)
class _Wanted:
    """What iter_shard reads of each sample besides image, caption and JSON."""

    members: tuple[str, ...]
    require_caption: bool
    image_suffixes: tuple[str, ...]


def _sample(shard: str, key: str, members: dict[str, bytes], want_images: bool,
            read: _Wanted) -> ShardSample:
    sample = ShardSample(shard=shard, key=key,
                         members={s: members[s] for s in read.members if s in members})
    if "json" in members:
        try:
            meta = json.loads(members["json"])
            if not isinstance(meta, dict):
                raise ValueError(f"a JSON {type(meta).__name__}, not an object")
            sample.meta = meta
        except (ValueError, UnicodeDecodeError) as err:
            sample.reject, sample.detail = BAD_JSON, f"{key}.json: {err}"[:300]
            return sample
    if "txt" in members:
        try:
            sample.caption = members["txt"].decode("utf-8").strip()
        except UnicodeDecodeError as err:
            if read.require_caption:
                sample.reject, sample.detail = NO_CAPTION, f"{key}.txt is not UTF-8 ({err})"[:300]
                return sample
    elif isinstance(sample.meta.get("caption"), str):
        sample.caption = sample.meta["caption"].strip()
    if not sample.caption and read.require_caption:
        sample.reject, sample.detail = NO_CAPTION, f"{key}: no .txt and no caption in .json"
        return sample
    sample.caption = sample.caption or None
    for suffix in read.image_suffixes:
        if suffix in members:
            sample.image_suffix = suffix
            sample.image = members[suffix] if want_images else None
            break
    else:
        sample.reject, sample.detail = NO_IMAGE, f"{key}: none of {read.image_suffixes}"
    return sample


def iter_shard(uri: str, *, images: bool = True, keys: Container[str] | None = None,
               endpoint_url: str | None = None, members: Collection[str] = (),
               require_caption: bool = True,
               image_suffixes: Sequence[str] = DEFAULT_IMAGE_SUFFIXES,
               ) -> Iterator[ShardSample]:
    """The samples of the shard at `uri` (local or s3://), in the tar's order.

    images: False skips the image members' bytes (extraction never decodes images; the
    tar is still read through, as a stream has to be). keys: only these samples are
    kept and yielded (a training task reads its own rows of a shard). members: further
    suffixes (e.g. "cls") whose bytes each sample keeps in ShardSample.members.
    require_caption: False keeps a sample without a caption (caption None; a .txt that is
    not UTF-8 is then no caption either) instead of rejecting it NO_CAPTION; a
    classification shard has none. image_suffixes: the image members, the first one a
    sample has is its image (CLIP_benchmark's wds reader prefers webp). A member that
    repeats within a sample, a key that comes back after another key, a bad .json and a
    shard cut short yield rejected samples (the last one named TRUNCATED_SHARD with no
    key of its own, when the cut falls between samples; UNREADABLE_SHARD when nothing of
    it reads as a tar). A shard that cannot be opened is a DataError.
    """
    read = _Wanted(tuple(members), require_caption, tuple(image_suffixes))
    fs, path = filesystem_for(uri, endpoint_url)
    try:
        size = fs.get_file_info(path).size
        stream = fs.open_input_stream(path)
    except (FileNotFoundError, OSError) as err:
        raise DataError(f"cannot open shard {uri}: {err}") from err
    seen: set[str] = set()
    key: str | None = None
    grouped: dict[str, bytes] = {}
    repeated: str | None = None

    def finish() -> ShardSample:
        if key in seen:
            return ShardSample(uri, key, reject=REPEATED_KEY,
                               detail=f"{key}: its members are not together in the tar")
        seen.add(key)
        if repeated is not None:
            return ShardSample(uri, key, reject=REPEATED_MEMBER,
                               detail=f"{key}.{repeated} appears twice")
        return _sample(uri, key, grouped, images, read)

    with stream:
        try:
            tar = tarfile.open(fileobj=stream, mode="r|*")
            for info in tar:
                if not info.isreg():
                    continue
                parts = split_member(info.name)
                if parts is None or posixpath.basename(info.name).startswith("__"):
                    continue
                member_key, suffix = parts
                if member_key != key:
                    if key is not None and (keys is None or key in keys):
                        yield finish()
                    key, grouped, repeated = member_key, {}, None
                skip = (keys is not None and key not in keys) or (
                    not images and suffix in read.image_suffixes)
                data = b"" if skip else tar.extractfile(info).read()
                if suffix in grouped:
                    repeated = suffix
                grouped[suffix] = data
        except (tarfile.TarError, EOFError, OSError) as err:
            # The sample being read when the cut came is not whole: rejected with the cut.
            yield ShardSample(uri, key or "", reject=TRUNCATED_SHARD if key or seen
                              else UNREADABLE_SHARD, detail=f"{uri}: {err}"[:300])
            return
        cut = _cut_short(tar, size, path)
        if cut:
            # tarfile ends a stream quietly at a header cut in two: the sample before it
            # may be missing members, so it is rejected with the cut.
            yield ShardSample(uri, key or "", reject=TRUNCATED_SHARD if key or seen
                              else UNREADABLE_SHARD, detail=f"{uri}: {cut}")
        elif key is not None and (keys is None or key in keys):
            yield finish()


# A tar ends with two 512-byte blocks of zeros (POSIX); tarfile and GNU tar write them.
END_OF_ARCHIVE = 1024


def _cut_short(tar: tarfile.TarFile, size: int, path: str) -> str | None:
    """Why an uncompressed tar whose members all read ends early, or None. A compressed
    tar (.tar.gz) is checked by its decompressor instead."""
    if path.endswith((".gz", ".bz2", ".xz", ".zst")) or size < 0:
        return None
    if size - tar.offset < END_OF_ARCHIVE:
        return (f"ends {size - tar.offset} bytes after its last whole member, without the "
                "end-of-archive blocks: cut short")
    return None
