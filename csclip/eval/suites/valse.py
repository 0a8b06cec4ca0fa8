"""VALSE (Parcalabescu et al., ACL 2022; Heidelberg-NLP/VALSE): caption vs foil on
linguistic phenomena, its validated items only (mturk caption votes >= 2, as its README
asks)."""

from __future__ import annotations

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    NOT_VALIDATED,
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
    read_json,
)

LAYOUT = ("the data/*.json files of the VALSE repository (existence.json, plurals.json, "
          "counting-*.json, relations.json, action-replacement.json, actant-swap.json, "
          "coreference-*.json, foil-it.json), at the top or in data/, and each item's image_file "
          "from its source dataset in images/ or images/<dataset>/")

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
    data = SuiteData("valse", tie_rule="strict", layout=LAYOUT, root=root)
    for name in FILES:
        uri = join(folder, f"{name}.json")
        if not exists(uri):
            continue
        subset = name.replace("-", "_")
        rows = read_json(uri)
        expect(isinstance(rows, dict), uri, "an object: id -> {image_file, caption, foil, mturk}")
        for row in rows.values():
            if not (isinstance(row, dict) and {"image_file", "caption", "foil"} <= set(row)):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            if (row.get("mturk") or {}).get("caption", 3) < 2:  # its README: not a valid foil
                data.skip(subset, reason=NOT_VALIDATED)
                continue
            image = str(row["image_file"])
            by_dataset = f"{row.get('dataset', '')}/{image}"
            refs = data.resolve(subset, images, by_dataset if images.ref(by_dataset) else image)
            if refs is not None:
                data.text_choices.append(TextChoice(subset, refs[0], (row["caption"], row["foil"]),
                                                    (0,)))
    return data
