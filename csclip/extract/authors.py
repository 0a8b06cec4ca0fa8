"""The CS-CLIP authors' unit files as the extraction pipeline's input (`backend.name:
authors`, `input.uri` a file, directory or glob, local or s3://); the format itself is read
by csclip.authors."""

from __future__ import annotations

import json

import pyarrow as pa

from csclip.authors import ReadResult, read_authors_uri
from csclip.config.extract import InputConfig
from csclip.errors import DataError
from csclip.extract.captions import CAPTION_SCHEMA
from csclip.units import record_to_row


def read_authors_input(cfg: InputConfig) -> ReadResult:
    """Every record of the files `cfg.uri` names (local or s3://), filtered to cfg.splits
    (records of other splits are not read, as for the caption readers)."""
    result = read_authors_uri(cfg.uri, cfg.image_root, cfg.endpoint_url, split=cfg.split,
                              restval_as_train=cfg.restval_as_train)
    if cfg.splits is not None:
        keep = {r.sample_id for r in result.records if r.split in cfg.splits}
        result.records = [r for r in result.records if r.sample_id in keep]
        result.item_rejections = [r for r in result.item_rejections if r.sample_id in keep]
    return result


AUTHORS_COLUMN = "authors_json"


def authors_caption_table(cfg: InputConfig) -> pa.Table:
    """The authors' records as the extraction pipeline's caption rows, sorted by
    sample_id: CAPTION_SCHEMA plus `authors_json`, holding the parsed units row with the
    items dropped from it, or the record's rejection (so read = loaded + rejected).
    Raises DataError when nothing is read."""
    result = read_authors_input(cfg)
    dropped: dict[str, list] = {}
    for item in result.item_rejections:
        dropped.setdefault(item.sample_id or "", []).append([item.reason.value, item.detail])
    rows = []
    for record in result.records:
        units_row = record_to_row(record)
        units_row.pop("image_bytes")
        payload = {"record": units_row, "dropped": dropped.get(record.sample_id, [])}
        rows.append({"sample_id": record.sample_id, "image_id": record.image_id,
                     "image_path": record.image_path, "caption": record.caption,
                     "split": record.split, AUTHORS_COLUMN: json.dumps(payload, sort_keys=True)})
    for rejection in result.rejections:
        payload = {"reason": rejection.reason.value, "detail": rejection.detail}
        rows.append({"sample_id": rejection.sample_id, "image_id": rejection.sample_id,
                     "image_path": None, "caption": "", "split": cfg.split or "",
                     AUTHORS_COLUMN: json.dumps(payload, sort_keys=True)})
    if not rows:
        raise DataError(f"no records read from {cfg.uri} (splits {cfg.splits}); check input.uri")
    rows.sort(key=lambda r: r["sample_id"])
    if cfg.limit is not None:
        rows = rows[: cfg.limit]
    schema = CAPTION_SCHEMA.append(pa.field(AUTHORS_COLUMN, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)
