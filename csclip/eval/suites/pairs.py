"""Winoground-style benchmarks published in their own formats: ColorSwap (Burapacheep et
al., 2024; its GitHub release data/{train,test}.json + images/, or the Hugging Face
Parquet files with inline images) and COLA multi-object (Ray et al., NeurIPS 2023; a JSON
list of [image, caption, image, caption])."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    UNREADABLE_IMAGE,
    BenchmarkNotFound,
    ImageFolder,
    Pair,
    SuiteData,
    expect,
    first_existing,
    join,
    read_json,
)
from csclip.storage import filesystem_for, list_files

COLORSWAP_LAYOUT = ("the GitHub release's data/test.json (id, caption_1, caption_2, image_1, "
                    "image_2 as images/img_<id>_<k>.png) with its images/ folder, or the Hugging "
                    "Face Parquet files (columns image_1, image_2 as {bytes, path}, caption_1, "
                    "caption_2; the test-* files only), at the top or under data/")
COLA_LAYOUT = ("COLA_multiobjects_matching_benchmark.json (at the top or under data/, as in "
               "the repository) and the Visual Genome images it links, by file name, in "
               "images/, vg_gqa_images/, VG_100K/ or VG_100K_2/")
COLORSWAP_SPLIT = "test"  # the benchmark; train.json / train-*.parquet is for fine-tuning
PAIR_FIELDS = {"image_1", "image_2", "caption_1", "caption_2"}


def load_colorswap(data_root: str) -> SuiteData:
    """ColorSwap's test pairs (caption_k describes image_k), from data/test.json and its
    images, else from the test split's Parquet files. Strict: ties are wrong."""
    root = join(data_root, "colorswap")
    data = SuiteData("colorswap", tie_rule="strict", layout=COLORSWAP_LAYOUT, root=root)
    test_json = first_existing(root, f"data/{COLORSWAP_SPLIT}.json", f"{COLORSWAP_SPLIT}.json")
    if test_json is not None:
        _colorswap_json(data, root, test_json)
        return data
    files = _colorswap_parquet_files(root)
    if not files:
        raise BenchmarkNotFound(f"colorswap: not found under {root} (expects {COLORSWAP_LAYOUT})")
    for filesystem, file in files:
        _colorswap_parquet(data, filesystem, file)
    return data


def _colorswap_json(data: SuiteData, root: str, uri: str) -> None:
    rows = read_json(uri)
    expect(isinstance(rows, list), uri, "a list of {id, caption_1, caption_2, image_1, image_2}")
    # image_k is relative to the JSON's folder ("images/img_0_1.png" beside data/test.json);
    # a copy that unpacked images/ at the top works too.
    images = ImageFolder(uri.rsplit("/", 1)[0], root)
    for row in rows:
        if not (isinstance(row, dict) and PAIR_FIELDS <= set(row)):
            data.skip("all", reason=MALFORMED_RECORD)
            continue
        refs = data.resolve("all", images, str(row["image_1"]), str(row["image_2"]))
        if refs is not None:
            data.pairs.append(Pair("all", refs[0], refs[1], row["caption_1"], row["caption_2"]))


def _colorswap_parquet_files(root: str) -> list:
    """The Parquet files of the test split (Hugging Face names them <split>-NNNNN-of-NNNNN
    or puts them under <split>/); all of them when none is named by a split."""
    files = []
    for folder in (root, join(root, "data"), join(root, "data", COLORSWAP_SPLIT),
                   join(root, COLORSWAP_SPLIT)):
        filesystem, path = filesystem_for(folder)
        files += [(filesystem, f) for f in list_files(filesystem, path, ".parquet")]

    def split_of(file: str) -> str | None:
        parent, name = file.rsplit("/", 2)[-2:]
        for split in ("train", "validation", "test"):
            if name.startswith(f"{split}-") or name == f"{split}.parquet" or parent == split:
                return split
        return None

    if any(split_of(f) is not None for _, f in files):
        return [(fs, f) for fs, f in files if split_of(f) == COLORSWAP_SPLIT]
    return files


def _colorswap_parquet(data: SuiteData, filesystem, file: str) -> None:
    table = pq.read_table(file, filesystem=filesystem)
    expect(PAIR_FIELDS <= set(table.column_names), file,
           "columns image_1, image_2, caption_1, caption_2")
    for index, row in enumerate(table.to_pylist()):
        keys = []
        for column in ("image_1", "image_2"):
            image = row[column]
            payload = image.get("bytes") if isinstance(image, dict) else image
            if not _is_image(payload):
                break
            key = f"colorswap/{row.get('id', f'{file}:{index}')}/{column}"
            data.images[key] = payload
            keys.append(key)
        if len(keys) < 2:
            data.skip("all", reason=UNREADABLE_IMAGE, example=f"{file} row {index}")
            continue
        data.pairs.append(Pair("all", keys[0], keys[1], row["caption_1"], row["caption_2"]))


def _is_image(payload: object) -> bool:
    """Whether inline bytes open as an image (PIL reads the header only)."""
    if not isinstance(payload, bytes | bytearray) or not payload:
        return False
    try:
        Image.open(io.BytesIO(payload))
    except (UnidentifiedImageError, OSError):
        return False
    return True


def load_cola(data_root: str) -> SuiteData:
    """COLA's multi-object matching pairs. Its official metric (ColaMultiObjAcc) is the
    image score (each caption prefers its own image: `cola_t2i`); text and group scores
    are reported next to it. Strict: the official code compares with >."""
    root = join(data_root, "cola")
    uri = first_existing(root, "COLA_multiobjects_matching_benchmark.json",
                         "data/COLA_multiobjects_matching_benchmark.json")
    if uri is None:
        raise BenchmarkNotFound(f"cola: not found under {root} (expects {COLA_LAYOUT})")
    images = ImageFolder(*(join(root, d) for d in ("images", "vg_gqa_images", "VG_100K",
                                                    "VG_100K_2")))
    data = SuiteData("cola", tie_rule="strict", layout=COLA_LAYOUT, root=root)
    rows = read_json(uri)
    expect(isinstance(rows, list), uri, "a list of [image_1, caption_1, image_2, caption_2]")
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4):
            data.skip("multi_objects", reason=MALFORMED_RECORD)
            continue
        names = [str(row[k]).rsplit("/", 1)[-1] for k in (0, 2)]
        refs = data.resolve("multi_objects", images, *names)
        if refs is not None:
            data.pairs.append(Pair("multi_objects", refs[0], refs[1], row[1], row[3]))
    return data
