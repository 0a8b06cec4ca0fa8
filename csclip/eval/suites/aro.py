"""ARO (Yuksekgonul et al., ICLR 2023; mertyg/vision-language-models-are-bows):
VG-Relation, VG-Attribution, COCO-Order and Flickr30k-Order, read from their published
files and scored as the official `evaluate_scores` does."""

from __future__ import annotations

import hashlib
import random
import re

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageFolder,
    MacroRule,
    SuiteData,
    TextChoice,
    crop_ref,
    exists,
    expect,
    join,
    read_json,
)
from csclip.shuffles import permute_positions, shuffle_trigrams, shuffle_within_trigrams

LAYOUT = ("visual_genome_relation.json, visual_genome_attribution.json and images/ (VG-R, "
          "VG-A); coco_karpathy_test.json with the val2014/ images it names (COCO-Order); "
          "flickr30k_test.json with flickr30k-images/ (Flickr30k-Order)")

# The official notebook's list of relations left out of VG-Relation's macro accuracy
# (their swapped caption can also be true).
SYMMETRIC_RELATIONS = frozenset((
    "adjusting", "attached to", "between", "bigger than", "biting", "boarding", "brushing",
    "chewing", "cleaning", "climbing", "close to", "coming from", "coming out of", "contain",
    "crossing", "dragging", "draped over", "drinking", "drinking from", "driving",
    "driving down", "driving on", "eating from", "eating in", "enclosing", "exiting",
    "facing", "filled with", "floating in", "floating on", "flying", "flying above",
    "flying in", "flying over", "flying through", "full of", "going down", "going into",
    "going through", "grazing in", "growing in", "growing on", "guiding", "hanging from",
    "hanging in", "hanging off", "hanging over", "higher than", "holding onto", "hugging",
    "in between", "jumping off", "jumping on", "jumping over", "kept in", "larger than",
    "leading", "leaning over", "leaving", "licking", "longer than", "looking in",
    "looking into", "looking out", "looking over", "looking through", "lying next to",
    "lying on top of", "making", "mixed with", "mounted on", "moving", "on the back of",
    "on the edge of", "on the front of", "on the other side of", "opening", "painted on",
    "parked at", "parked beside", "parked by", "parked in", "parked in front of",
    "parked near", "parked next to", "perched on", "petting", "piled on", "playing",
    "playing in", "playing on", "playing with", "pouring", "reaching for", "reading",
    "reflected on", "riding on", "running in", "running on", "running through",
    "seen through", "sitting behind", "sitting beside", "sitting by", "sitting in front of",
    "sitting near", "sitting next to", "sitting under", "skiing down", "skiing on",
    "sleeping in", "sleeping on", "smiling at", "sniffing", "splashing", "sprinkled on",
    "stacked on", "standing against", "standing around", "standing behind",
    "standing beside", "standing in front of", "standing near", "standing next to",
    "staring at", "stuck in", "surrounding", "swimming in", "swinging", "talking to",
    "topped with", "touching", "traveling down", "traveling on", "tying", "typing on",
    "underneath", "wading in", "waiting for", "walking across", "walking by",
    "walking down", "walking next to", "walking through", "working in", "working on",
    "worn on", "wrapped around", "wrapped in", "by", "of", "near", "next to", "with",
    "beside", "on the side of", "around",
))  # fmt: skip

# Words that are never nouns or adjectives, standing in for the official spaCy tagger
# (no tagger model can be downloaded here): the two noun/adjective shuffles move the other
# words, or these. The trigram shuffles are exact.
_FUNCTION_WORDS = frozenset("""a an the of and or with in on at to is are was were be been
being by for from into onto over under near next behind above below beside between up down
out off while as that this these those there here it its his her their they he she we you
i some one two three four five several many few no not very has have had do does did can
could will would while who which what where when""".split())


def pre_caption(caption: str, max_words: int = 30) -> str:
    """ARO's (BLIP's) caption cleaning: lower case, punctuation to spaces, at most
    max_words words."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    return " ".join(caption.split(" ")[:max_words])


def order_perturbations(caption: str) -> tuple[str, ...]:
    """The four ARO order foils of a caption, in the official order: shuffle nouns and
    adjectives, shuffle all but nouns and adjectives, shuffle within trigrams, shuffle
    trigrams. Seeded by the caption, so the benchmark is the same on every run."""
    rng = random.Random(int.from_bytes(hashlib.sha256(caption.encode()).digest()[:8], "big"))
    tokens = re.findall(r"\w+|[^\w\s]", caption)
    content = [i for i, t in enumerate(tokens) if t.isalpha() and t.lower() not in _FUNCTION_WORDS]
    other = [i for i in range(len(tokens)) if i not in set(content)]
    # The draws in this order (within, trigrams, then the two permutations) keep the
    # benchmark's foils what they have been.
    within = shuffle_within_trigrams(tokens, rng)
    reordered = shuffle_trigrams(tokens, rng)
    return tuple(" ".join(words) for words in (
        permute_positions(tokens, content, rng), permute_positions(tokens, other, rng), within,
        reordered))


def _visual_genome(data: SuiteData, root: str, file: str, subset: str) -> None:
    uri = join(root, file)
    rows = read_json(uri)
    expect(isinstance(rows, list), uri, "a list of test cases")
    images = ImageFolder(join(root, "images"))
    for row in rows:
        category_field = "relation_name" if subset == "vg_relation" else "attributes"
        if not (isinstance(row, dict) and {"image_path", "true_caption", "false_caption", "bbox_x",
                                           "bbox_y", "bbox_w", "bbox_h", category_field} <= set(row)):
            data.skip(subset, reason=MALFORMED_RECORD)
            continue
        ref, reason = images.lookup(row["image_path"])
        if reason is not None:
            data.skip(subset, reason=reason, example=ref or join(images.root, row["image_path"]))
            continue
        key = crop_ref(ref, row["bbox_x"], row["bbox_y"], row["bbox_w"], row["bbox_h"])
        data.images[key] = key
        category = (row["relation_name"] if subset == "vg_relation"
                    else "_".join(row["attributes"][:2]))
        # The official candidate order: [false, true]; argmax over it picks the false
        # caption on a tie.
        data.text_choices.append(TextChoice(subset, key, (row["false_caption"],
                                                          row["true_caption"]), (1,), category))


def _order(data: SuiteData, root: str, file: str, subset: str) -> None:
    uri = join(root, file)
    rows = read_json(uri)
    expect(isinstance(rows, list), uri, "a list of {image, caption: [...]}")
    images = ImageFolder(root)
    for row in rows:
        if not (isinstance(row, dict) and "image" in row and isinstance(row.get("caption"), list)):
            data.skip(subset, reason=MALFORMED_RECORD)
            continue
        ref, reason = images.lookup(row["image"])
        if reason is not None and row["caption"]:  # each caption would have been an item
            data.skip(subset, len(row["caption"]), reason, example=ref or join(root, row["image"]))
            continue
        for caption in row["caption"]:
            data.images[ref] = ref
            foils = tuple(pre_caption(p) for p in order_perturbations(caption))
            # The true caption is first: the official argmax counts a tie as right.
            data.text_choices.append(TextChoice(subset, ref, (pre_caption(caption), *foils), (0,)))


SUBSETS = {
    "vg_relation": ("visual_genome_relation.json", _visual_genome),
    "vg_attribution": ("visual_genome_attribution.json", _visual_genome),
    "coco_order": ("coco_karpathy_test.json", _order),
    "flickr30k_order": ("flickr30k_test.json", _order),
}


def load_aro(data_root: str, protocol: str = "official") -> SuiteData:
    """The ARO subsets whose file is under <data_root>/aro. VG subsets score the crop of
    the relation's box, as the official loader does. Their accuracy is a macro mean over
    categories: officially (the ARO notebook and `VG_Attribution.evaluate_scores`),
    VG-Relation over every relation except the notebook's symmetric ones and
    VG-Attribution over attribute pairs with >= 25 items; with protocol "paper" (the
    CS-CLIP authors' code) both over every category. Ties follow the official np.argmax
    (first candidate wins)."""
    root = join(data_root, "aro")
    found = {s: f for s, (f, _) in SUBSETS.items() if exists(join(root, f))}
    if not found:
        raise BenchmarkNotFound(f"aro: not found under {root} (expects {LAYOUT})")
    macro = ({"vg_relation": MacroRule(1), "vg_attribution": MacroRule(1)} if protocol == "paper"
             else {"vg_relation": MacroRule(1, SYMMETRIC_RELATIONS),
                   "vg_attribution": MacroRule(25)})
    data = SuiteData("aro", tie_rule="argmax_first", macro=macro)
    for subset, file in found.items():
        SUBSETS[subset][1](data, root, file, subset)
    return data
