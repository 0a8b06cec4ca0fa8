"""ColorFoil (Samin et al., 2024; samin9796/ColorFoil): COCO val2017 captions that name a
CSS3 color, each against a foil with its color words replaced. The benchmark is built,
not shipped: its notebook (zero_shot_evaluation.ipynb) derives it from COCO's
`captions_val2017.json`, and so does this loader.

Official (the notebook): images in the annotation file's order; per image its first
caption holding a CSS3 color name as a space-separated word (case and punctuation
included); every such word replaced, by `str.replace`, with one of ten common colors
drawn at random (the next one down when the draw is the same color); the notebook's four
greyscale images (positions 550, 1164, 1752, 2236 of that list) left out; right when the
caption scores strictly above the foil. The notebook's draw is unseeded; ours is
random.Random(seed 0), so the benchmark is the same on every run. Paper (the CS-CLIP
authors' data_loading/colorfoil.py): color words matched lower-cased with punctuation
stripped, replaced word by word (keeping a capital and the punctuation), no greyscale
exclusion."""

from __future__ import annotations

import random

from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    expect,
    first_existing,
    join,
    read_json,
)

LAYOUT = ("COCO's annotations/captions_val2017.json (or captions_val2017.json) and the "
          "val2017/ images, under colorfoil/ (images may also be in <data-root>/coco/val2017); "
          "or the CS-CLIP authors' saved list [{image_id, caption, foil}] in that file with "
          "images/<image_id>.jpg")
# The notebook's foil colors, in its order.
FOIL_COLORS = ("blue", "black", "red", "pink", "yellow", "grey", "orange", "white", "green",
               "brown")
GREYSCALE_POSITIONS = frozenset((550, 1164, 1752, 2236))
PUNCTUATION = '.,!?;:"()[]'
SEED = 0
# webcolors.CSS3_NAMES_TO_HEX's keys (the CSS3 extended color keywords, both spellings
# of gray), which the notebook matches against.
CSS3_NAMES = frozenset("""aliceblue antiquewhite aqua aquamarine azure beige bisque black
blanchedalmond blue blueviolet brown burlywood cadetblue chartreuse chocolate coral
cornflowerblue cornsilk crimson cyan darkblue darkcyan darkgoldenrod darkgray darkgrey
darkgreen darkkhaki darkmagenta darkolivegreen darkorange darkorchid darkred darksalmon
darkseagreen darkslateblue darkslategray darkslategrey darkturquoise darkviolet deeppink
deepskyblue dimgray dimgrey dodgerblue firebrick floralwhite forestgreen fuchsia gainsboro
ghostwhite gold goldenrod gray grey green greenyellow honeydew hotpink indianred indigo
ivory khaki lavender lavenderblush lawngreen lemonchiffon lightblue lightcoral lightcyan
lightgoldenrodyellow lightgray lightgrey lightgreen lightpink lightsalmon lightseagreen
lightskyblue lightslategray lightslategrey lightsteelblue lightyellow lime limegreen linen
magenta maroon mediumaquamarine mediumblue mediumorchid mediumpurple mediumseagreen
mediumslateblue mediumspringgreen mediumturquoise mediumvioletred midnightblue mintcream
mistyrose moccasin navajowhite navy oldlace olive olivedrab orange orangered orchid
palegoldenrod palegreen paleturquoise palevioletred papayawhip peachpuff peru pink plum
powderblue purple red rosybrown royalblue saddlebrown salmon sandybrown seagreen seashell
sienna silver skyblue slateblue slategray slategrey snow springgreen steelblue tan teal
thistle tomato turquoise violet wheat white whitesmoke yellow yellowgreen""".split())


def _draw(rng: random.Random, color: str) -> str:
    num = rng.randint(0, 9)
    return FOIL_COLORS[num - 1] if FOIL_COLORS[num] == color else FOIL_COLORS[num]


def official_foil(caption: str, rng: random.Random) -> str:
    """The notebook's create_foil: every CSS3 word (exact match) replaced everywhere in
    the caption by str.replace."""
    for word in caption.split(" "):
        if word in CSS3_NAMES:
            caption = caption.replace(word, _draw(rng, word))
    return caption


def _clean(word: str) -> str:
    return word.strip(PUNCTUATION).lower()


def paper_foil(caption: str, rng: random.Random) -> str:
    """The CS-CLIP authors' _create_foil: word by word, lower-cased match without
    punctuation; the replacement keeps a leading capital and the word's punctuation."""
    out = []
    for word in caption.split(" "):
        clean = _clean(word)
        if clean not in CSS3_NAMES:
            out.append(word)
            continue
        color = _draw(rng, clean)
        if word[0].isupper():
            color = color.capitalize()
        out.append(color + "".join(c for c in word if c in PUNCTUATION))
    return " ".join(out)


def build_colorfoil(annotations: dict, protocol: str = "official",
                    seed: int = SEED) -> list[tuple[str, str, str]]:
    """(image file name, caption, foil) in the benchmark's order, built from COCO's
    captions file as the protocol's code does."""
    paper = protocol == "paper"
    by_image: dict[int, list[str]] = {}
    for annotation in annotations["annotations"]:
        by_image.setdefault(annotation["image_id"], []).append(annotation["caption"])
    rng = random.Random(seed)
    out = []
    for image in annotations["images"]:
        for caption in by_image.get(image["id"], []):
            words = caption.split(" ")
            if any((_clean(w) if paper else w) in CSS3_NAMES for w in words):
                foil = paper_foil(caption, rng) if paper else official_foil(caption, rng)
                name = image.get("file_name") or str(image["coco_url"]).rsplit("/", 1)[-1]
                out.append((name, caption, foil))
                break
    if not paper:
        out = [row for i, row in enumerate(out) if i not in GREYSCALE_POSITIONS]
    return out


def load_colorfoil(data_root: str, protocol: str = "official") -> SuiteData:
    """ColorFoil built from <data_root>/colorfoil's COCO captions file as the protocol's
    code builds it, or read from the CS-CLIP authors' saved benchmark (the list their
    loader writes to the same path, foils fixed); one subset, all."""
    root = join(data_root, "colorfoil")
    uri = first_existing(root, "annotations/captions_val2017.json", "captions_val2017.json")
    images_dir = first_existing(root, "val2017", "images") or first_existing(
        join(data_root, "coco"), "val2017")
    if uri is None or images_dir is None:
        raise BenchmarkNotFound(f"colorfoil: not found under {root} (expects {LAYOUT})")
    annotations = read_json(uri)
    data = SuiteData("colorfoil", tie_rule="strict")
    if isinstance(annotations, list):  # the CS-CLIP authors' saved benchmark, read as is
        expect(all(isinstance(r, dict) and {"image_id", "caption", "foil"} <= set(r)
                   for r in annotations), uri, "a list of {image_id, caption, foil}")
        rows = [(f"{r['image_id']}.jpg", r["caption"], r["foil"]) for r in annotations]
        images_dir = first_existing(root, "images") or images_dir
    else:
        expect(isinstance(annotations, dict) and {"images", "annotations"} <= set(annotations),
               uri, "COCO captions: an object with images and annotations")
        rows = build_colorfoil(annotations, protocol)
    images = ImageFolder(images_dir)
    for name, caption, foil in rows:
        refs = data.resolve("all", images, name)
        if refs is not None:
            data.text_choices.append(TextChoice("all", refs[0], (caption, foil), (0,)))
    return data
