"""What'sUp (Kamath et al., EMNLP 2023; amitakamath/whatsup_vlms): spatial prepositions
on controlled photos (A, B) and COCO / VG crops, scored as its official evaluate_scores."""

from __future__ import annotations

from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
    read_json,
)

LAYOUT = ("controlled_images_dataset.json + data/controlled_images/, controlled_clevr_dataset"
          ".json + data/controlled_clevr/ (the image_path each entry names), "
          "coco_qa_{one,two}_obj.json + val2017/, vg_qa_{one,two}_obj.json + vg_images/")

CONTROLLED = {"controlled_a": "controlled_images_dataset.json",
              "controlled_b": "controlled_clevr_dataset.json"}
QA = {"coco_one": ("coco_qa_one_obj.json", "val2017", "{:012d}.jpg"),
      "coco_two": ("coco_qa_two_obj.json", "val2017", "{:012d}.jpg"),
      "vg_one": ("vg_qa_one_obj.json", "vg_images", "{}.jpg"),
      "vg_two": ("vg_qa_two_obj.json", "vg_images", "{}.jpg")}


def load_whatsup(data_root: str) -> SuiteData:
    """The What'sUp subsets found under <data_root>/whatsup. The true caption is the first
    option; the official np.argmax gives a tie to it (a tie counts as right)."""
    root = join(data_root, "whatsup")
    present = [s for s, f in CONTROLLED.items() if exists(join(root, f))]
    present += [s for s, (f, _, _) in QA.items() if exists(join(root, f))]
    if not present:
        raise BenchmarkNotFound(f"whatsup: not found under {root} (expects {LAYOUT})")
    data = SuiteData("whatsup", tie_rule="argmax_first")
    images = ImageFolder(root)
    for subset in present:
        if subset in CONTROLLED:
            uri = join(root, CONTROLLED[subset])
            for row in read_json(uri):
                expect(isinstance(row, dict) and "image_path" in row and
                       len(row.get("caption_options", ())) >= 2, uri,
                       "each entry has image_path and caption_options")
                _add(data, images, subset, row["image_path"], row["caption_options"])
        else:
            file, folder, pattern = QA[subset]
            uri = join(root, file)
            for row in read_json(uri):
                expect(isinstance(row, list) and len(row) == 3, uri,
                       "each entry is [image_id, true caption, false caption]")
                name = pattern.format(int(row[0])) if "{:012d}" in pattern else pattern.format(row[0])
                _add(data, images, subset, f"{folder}/{name}", row[1:])
    return data


def _add(data: SuiteData, images: ImageFolder, subset: str, path: str, options) -> None:
    ref = images.ref(path)
    if ref is None:
        data.skip(subset)
        return
    data.images[ref] = ref
    data.text_choices.append(TextChoice(subset, ref, tuple(options), (0,)))
