"""What'sUp (Kamath et al., EMNLP 2023; amitakamath/whatsup_vlms): spatial prepositions
on controlled photos (A, B) and COCO / VG crops, scored as its official evaluate_scores."""

from __future__ import annotations

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    first_existing,
    join,
    read_json,
)

LAYOUT = ("the repository's data/ folder (controlled_images_dataset.json, controlled_clevr_"
          "dataset.json, coco_qa_{one,two}_obj.json, vg_qa_{one,two}_obj.json with "
          "controlled_images/, controlled_clevr/, val2017/, vg_images/ beside them; image_path "
          "as written, data/controlled_images/...), as whatsup/data/ or whatsup/ itself")

CONTROLLED = {"controlled_a": "controlled_images_dataset.json",
              "controlled_b": "controlled_clevr_dataset.json"}
QA = {"coco_one": ("coco_qa_one_obj.json", "val2017", "{:012d}.jpg"),
      "coco_two": ("coco_qa_two_obj.json", "val2017", "{:012d}.jpg"),
      "vg_one": ("vg_qa_one_obj.json", "vg_images", "{}.jpg"),
      "vg_two": ("vg_qa_two_obj.json", "vg_images", "{}.jpg")}


def load_whatsup(data_root: str) -> SuiteData:
    """The What'sUp subsets found under <data_root>/whatsup, its JSON files either in
    data/ (the repository's layout, the official root_dir="data") or at the top. The true
    caption is the first option; the official np.argmax gives a tie to it (a tie counts
    as right)."""
    root = join(data_root, "whatsup")
    files = (*CONTROLLED.values(), *(f for f, _, _ in QA.values()))
    folder = next((f for f in (join(root, "data"), root)
                   if any(exists(join(f, name)) for name in files)), None)
    if folder is None:
        raise BenchmarkNotFound(f"whatsup: not found under {root} (expects {LAYOUT})")
    data = SuiteData("whatsup", tie_rule="argmax_first", layout=LAYOUT, root=root)
    # image_path is relative to the repository root ("data/controlled_images/x.jpeg"):
    # resolve it there, or inside the JSON's folder without its "data/".
    controlled = ImageFolder(root, folder, strip=("data/",))
    for subset, file in CONTROLLED.items():
        uri = join(folder, file)
        if not exists(uri):
            continue
        rows = read_json(uri)
        expect(isinstance(rows, list), uri, "a list of {image_path, caption_options}")
        for row in rows:
            if not (isinstance(row, dict) and isinstance(row.get("image_path"), str)
                    and len(row.get("caption_options") or ()) >= 2):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            _add(data, controlled, subset, row["image_path"], row["caption_options"])
    for subset, (file, image_dir, pattern) in QA.items():
        uri = join(folder, file)
        if not exists(uri):
            continue
        images = ImageFolder(join(folder, image_dir), join(root, image_dir),
                             *([first_existing(data_root, "coco/val2017")] if "coco" in subset
                               and first_existing(data_root, "coco/val2017") else []))
        rows = read_json(uri)
        expect(isinstance(rows, list), uri, "a list of [image_id, true caption, false caption]")
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            name = pattern.format(int(row[0])) if "{:012d}" in pattern else pattern.format(row[0])
            _add(data, images, subset, name, row[1:])
    return data


def _add(data: SuiteData, images: ImageFolder, subset: str, path: str, options) -> None:
    refs = data.resolve(subset, images, path)
    if refs is not None:
        data.text_choices.append(TextChoice(subset, refs[0], tuple(options), (0,)))
