"""Winoground (Thrush et al., CVPR 2022) and benchmarks published in its layout
(COCO-Counterfactuals): pairs of images and captions, text / image / group scores."""

from __future__ import annotations

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageFolder,
    Pair,
    SuiteData,
    first_existing,
    join,
    read_json,
)

LAYOUT = ("examples.jsonl (id, caption_0, caption_1, image_0, image_1[, collapsed_tag]) at "
          "the top or under data/ (the Hugging Face release), its images (<image_k> with or "
          "without .png / .jpg) in images/ beside it or beside the file itself (the "
          "CS-CLIP authors' loader)")


def load_pairs_jsonl(data_root: str, benchmark: str, subset_field: str | None,
                     extensions: tuple[str, ...] = (".png", ".jpg", ".jpeg")) -> SuiteData:
    """Pairs from <data_root>/<benchmark>/[data/]examples.jsonl; an image name without an
    extension gets the first one under which it exists, in images/ beside the file or
    beside the file itself. Subsets: the `subset_field` value (lower case), else "all"."""
    root = join(data_root, benchmark)
    examples = first_existing(root, "examples.jsonl", "data/examples.jsonl")
    if examples is None:
        raise BenchmarkNotFound(f"{benchmark}: not found under {root} (expects {LAYOUT})")
    folder = examples.rsplit("/", 1)[0]
    images = ImageFolder(join(folder, "images"), folder)
    data = SuiteData(benchmark, tie_rule="strict", pooled=True, layout=LAYOUT, root=root)
    fields = {"caption_0", "caption_1", "image_0", "image_1"}
    for row in read_json(examples):
        subset = (str(row.get(subset_field) or "all").lower() if subset_field
                  and isinstance(row, dict) else "all")
        if not (isinstance(row, dict) and fields <= set(row)):
            data.skip(subset, reason=MALFORMED_RECORD)
            continue
        names = [_with_extension(images, str(row[k]), extensions) for k in ("image_0", "image_1")]
        refs = data.resolve(subset, images, *names)
        if refs is not None:
            data.pairs.append(Pair(subset, refs[0], refs[1], row["caption_0"], row["caption_1"]))
    return data


def _with_extension(images: ImageFolder, name: str, extensions: tuple[str, ...]) -> str:
    """`name` itself when it has an extension; else name + the first extension present
    (name + extensions[0] when none is, so the skip names a plausible file)."""
    if "." in name.rsplit("/", 1)[-1]:
        return name
    return next((name + e for e in extensions if images.ref(name + e)), name + extensions[0])


def load_winoground(data_root: str) -> SuiteData:
    """Winoground's 400 pairs from its published examples.jsonl, subsets by collapsed_tag
    (object, relation, both); the benchmark's scores pool all pairs, as the paper does.
    Strict: the official code compares with >, so a tie is wrong."""
    return load_pairs_jsonl(data_root, "winoground", "collapsed_tag")


def load_coco_counterfactuals(data_root: str) -> SuiteData:
    """COCO-Counterfactuals (Le et al., NeurIPS 2023), published in Winoground's layout
    (examples.jsonl with caption_0/1, image_0/1; images/)."""
    return load_pairs_jsonl(data_root, "coco_cf", None, extensions=(".jpg", ".png", ".jpeg"))
