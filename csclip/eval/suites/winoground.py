"""Winoground (Thrush et al., CVPR 2022) and benchmarks published in its layout
(COCO-Counterfactuals): pairs of images and captions, text / image / group scores."""

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

LAYOUT = ("examples.jsonl (id, caption_0, caption_1, image_0, image_1, collapsed_tag) and "
          "images/<image_k>.png, at the top or under data/")


def load_pairs_jsonl(data_root: str, benchmark: str, subset_field: str | None,
                     extensions: tuple[str, ...] = (".png", ".jpg", ".jpeg")) -> SuiteData:
    """Pairs from <data_root>/<benchmark>/[data/]examples.jsonl; image names get the first
    extension under which they exist in images/. Subsets: the `subset_field` value
    (lower case), else "all"."""
    root = join(data_root, benchmark)
    examples = first_existing(root, "examples.jsonl", "data/examples.jsonl")
    if examples is None:
        raise BenchmarkNotFound(f"{benchmark}: not found under {root} (expects {LAYOUT})")
    images = ImageFolder(join(examples.rsplit("/", 1)[0], "images"))
    data = SuiteData(benchmark, tie_rule="strict", pooled=True)
    for row in read_json(examples):
        expect(isinstance(row, dict) and {"caption_0", "caption_1", "image_0", "image_1"} <= set(row),
               examples, "each line has caption_0, caption_1, image_0, image_1")
        subset = str(row.get(subset_field) or "all").lower() if subset_field else "all"
        refs = []
        for name in (str(row["image_0"]), str(row["image_1"])):
            candidates = [name] if "." in name.rsplit("/", 1)[-1] else [name + e for e in extensions]
            refs.append(next((r for r in map(images.ref, candidates) if r), None))
        if None in refs:
            data.skip(subset)
            continue
        data.images.update({r: r for r in refs})
        data.pairs.append(Pair(subset, refs[0], refs[1], row["caption_0"], row["caption_1"]))
    return data


def load_winoground(data_root: str) -> SuiteData:
    """Winoground's 400 pairs from its published examples.jsonl, subsets by collapsed_tag
    (object, relation, both); the benchmark's scores pool all pairs, as the paper does.
    Strict: the official code compares with >, so a tie is wrong."""
    return load_pairs_jsonl(data_root, "winoground", "collapsed_tag")


def load_coco_counterfactuals(data_root: str) -> SuiteData:
    """COCO-Counterfactuals (Le et al., NeurIPS 2023), published in Winoground's layout
    (examples.jsonl with caption_0/1, image_0/1; images/)."""
    return load_pairs_jsonl(data_root, "coco_cf", None)
