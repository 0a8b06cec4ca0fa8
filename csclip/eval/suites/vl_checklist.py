"""VL-CheckList (Zhao et al., 2022; om-ai-lab/VL-CheckList): its corpus of YAML configs
(ANNO_PATH, IMG_ROOT) pointing at JSON lists of [image path, {POS: [...], NEG: [...]}],
scored as its image-text contrastive task (`itc`: the first positive against the first
negative, strict)."""

from __future__ import annotations

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
    read_json,
)

LAYOUT = ("the repository's corpus/v1/<Attribute|Object|Relation>/.../<name>.yaml (ANNO_PATH, "
          "IMG_ROOT) and the data/ JSON files they name, with the image folders (vg/, swig/, "
          "hake/) named by IMG_ROOT")


def _corpus_files(root: str) -> list[str]:
    import pyarrow.fs as pafs

    from csclip.storage import filesystem_for

    filesystem, path = filesystem_for(join(root, "corpus", "v1"))
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    scheme = "s3://" if root.startswith("s3://") else ""
    return sorted(scheme + i.path for i in infos
                  if i.type == pafs.FileType.File and i.path.endswith(".yaml"))


def load_vl_checklist(data_root: str) -> SuiteData:
    """Every corpus config under <data_root>/vl_checklist/corpus/v1; subset =
    <type>_<category> (attribute_color, object_location, object_size, relation_action,
    relation_spatial, ...), pooling that category's source datasets. Right when the image
    scores its first POS text strictly above its first NEG text (the official `itc` code
    compares with >)."""
    import yaml

    from csclip.storage import filesystem_for, read_bytes

    root = join(data_root, "vl_checklist")
    configs = _corpus_files(root) if exists(join(root, "corpus")) else []
    if not configs:
        raise BenchmarkNotFound(f"vl_checklist: not found under {root} (expects {LAYOUT})")
    data = SuiteData("vl_checklist", tie_rule="strict")
    corpus = join(root, "corpus", "v1")
    for uri in configs:
        parts = uri[len(corpus) + 1:].split("/")
        subset = f"{parts[0].lower()}_{parts[1].lower()}" if len(parts) > 2 else parts[0].lower()
        filesystem, path = filesystem_for(uri)
        config = yaml.safe_load(read_bytes(filesystem, path))
        expect(isinstance(config, dict) and {"ANNO_PATH", "IMG_ROOT"} <= set(config), uri,
               "a corpus config with ANNO_PATH and IMG_ROOT")
        annotation = join(root, config["ANNO_PATH"])
        if not exists(annotation):
            continue  # a corpus whose annotation file is not here: not part of this copy
        images = ImageFolder(join(root, config["IMG_ROOT"]))
        for row in read_json(annotation):
            if not (isinstance(row, list) and len(row) == 2 and isinstance(row[1], dict)
                    and row[1].get("POS") and row[1].get("NEG")):  # [image, {POS, NEG}]
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            refs = data.resolve(subset, images, row[0])
            if refs is None:
                continue
            data.text_choices.append(TextChoice(subset, refs[0], (row[1]["POS"][0],
                                                                  row[1]["NEG"][0]), (0,)))
    return data
