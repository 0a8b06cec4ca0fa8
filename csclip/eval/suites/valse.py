"""VALSE (Parcalabescu et al., ACL 2022; Heidelberg-NLP/VALSE): caption vs foil on
linguistic phenomena, its validated items only (mturk caption votes >= 2, as its README
asks)."""

from __future__ import annotations

import logging

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

log = logging.getLogger(__name__)

LAYOUT = ("the data/*.json files of the VALSE repository (existence.json, plurals.json, "
          "counting-*.json, relations.json, action-replacement.json, actant-swap.json, "
          "coreference-*.json, foil-it.json) and images/<image_file>")

FILES = ("existence", "plurals", "counting-hard", "counting-small-quant", "counting-adversarial",
         "relations", "action-replacement", "actant-swap", "coreference-standard",
         "coreference-hard", "foil-it")


def load_valse(data_root: str) -> SuiteData:
    """VALSE's pieces found under <data_root>/valse[/data]; subset = file name with "_"
    for "-". Strict (a tie is wrong): the official scripts count a detected foil only when
    the caption scores better."""
    root = join(data_root, "valse")
    folder = next((join(root, d) for d in ("data", "") if
                   any(exists(join(root, d, f"{f}.json")) for f in FILES)), None)
    if folder is None:
        raise BenchmarkNotFound(f"valse: not found under {root} (expects {LAYOUT})")
    images = ImageFolder(join(root, "images"))
    data = SuiteData("valse", tie_rule="strict")
    for name in FILES:
        uri = join(folder, f"{name}.json")
        if not exists(uri):
            continue
        subset, invalid = name.replace("-", "_"), 0
        rows = read_json(uri)
        expect(isinstance(rows, dict), uri, "an object: id -> {image_file, caption, foil, mturk}")
        for row in rows.values():
            expect({"image_file", "caption", "foil"} <= set(row), uri,
                   "each item has image_file, caption, foil")
            if row.get("mturk", {}).get("caption", 3) < 2:  # not validated by annotators
                invalid += 1
                continue
            ref = images.ref(row["image_file"])
            if ref is None:
                data.skip(subset)
                continue
            data.images[ref] = ref
            data.text_choices.append(TextChoice(subset, ref, (row["caption"], row["foil"]), (0,)))
        if invalid:
            log.info("valse %s: %d items left out (not validated: mturk caption < 2)", subset,
                     invalid)
    return data
