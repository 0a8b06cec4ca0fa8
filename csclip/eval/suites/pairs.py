"""Winoground-style benchmarks published in their own formats: ColorSwap (Burapacheep et
al., 2024; Parquet with inline images) and COLA multi-object (Ray et al., NeurIPS 2023;
a JSON list of [image, caption, image, caption])."""

from __future__ import annotations

from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageFolder,
    Pair,
    SuiteData,
    expect,
    first_existing,
    join,
    read_json,
)

COLORSWAP_LAYOUT = ("the Parquet files of the published dataset (columns id, image_1, "
                    "image_2 as {bytes, path}, caption_1, caption_2), at the top or under data/")
COLA_LAYOUT = ("COLA_multiobjects_matching_benchmark.json (at the top or under data/) and "
               "images/<file name of each image URL>")


def load_colorswap(data_root: str) -> SuiteData:
    """ColorSwap's pairs (caption_k describes image_k), images read from the Parquet
    rows. Strict: ties are wrong."""
    import pyarrow.parquet as pq

    from csclip.storage import filesystem_for, list_files

    root = join(data_root, "colorswap")
    files = []
    for folder in (root, join(root, "data")):
        filesystem, path = filesystem_for(folder)
        files += [(filesystem, f) for f in list_files(filesystem, path, ".parquet")]
    if not files:
        raise BenchmarkNotFound(f"colorswap: not found under {root} (expects {COLORSWAP_LAYOUT})")
    data = SuiteData("colorswap", tie_rule="strict")
    for filesystem, file in files:
        table = pq.read_table(file, filesystem=filesystem)
        expect({"image_1", "image_2", "caption_1", "caption_2"} <= set(table.column_names),
               file, "columns image_1, image_2, caption_1, caption_2")
        for index, row in enumerate(table.to_pylist()):
            keys = []
            for column in ("image_1", "image_2"):
                image = row[column]
                payload = image.get("bytes") if isinstance(image, dict) else image
                key = f"colorswap/{row.get('id', f'{file}:{index}')}/{column}"
                data.images[key] = payload
                keys.append(key)
            data.pairs.append(Pair("all", keys[0], keys[1], row["caption_1"], row["caption_2"]))
    return data


def load_cola(data_root: str) -> SuiteData:
    """COLA's multi-object matching pairs. Its official metric (ColaMultiObjAcc) is the
    image score (each caption prefers its own image: `cola_t2i`); text and group scores
    are reported next to it. Strict: the official code compares with >."""
    root = join(data_root, "cola")
    uri = first_existing(root, "COLA_multiobjects_matching_benchmark.json",
                         "data/COLA_multiobjects_matching_benchmark.json")
    if uri is None:
        raise BenchmarkNotFound(f"cola: not found under {root} (expects {COLA_LAYOUT})")
    images = ImageFolder(join(root, "images"))
    data = SuiteData("cola", tie_rule="strict")
    for row in read_json(uri):
        expect(isinstance(row, list) and len(row) == 4, uri,
               "each entry is [image_1, caption_1, image_2, caption_2]")
        refs = [images.ref(str(row[k]).rsplit("/", 1)[-1]) for k in (0, 2)]
        if None in refs:
            data.skip("multi_objects")
            continue
        data.images.update({r: r for r in refs})
        data.pairs.append(Pair("multi_objects", refs[0], refs[1], row[1], row[3]))
    return data
