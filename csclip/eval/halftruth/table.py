"""The benchmark table (Parquet / CSV): shareable, rescorable."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from csclip.errors import DataError
from csclip.eval.halftruth.items import ALL_CONDITIONS, CONDITION_BY_SLUG, HalfTruthItem

BENCHMARK_SCHEMA = pa.schema(
    [
        pa.field(name, pa.string(), nullable=False)
        for name in (
            "image_id",
            "sample_id",
            "condition",
            "group",
            "anchor",
            "completion",
            "half_truth",
            "unit",
            "foil",
        )
    ]
)
# Tables written before the provenance columns existed lack these two: read as "".
_OPTIONAL_COLUMNS = ("unit", "foil")


def items_to_table(items: Sequence[HalfTruthItem]) -> pa.Table:
    rows = [{name: getattr(item, name) for name in BENCHMARK_SCHEMA.names} for item in items]
    return pa.Table.from_pylist(rows, schema=BENCHMARK_SCHEMA)


def table_to_items(table: pa.Table, origin: str = "benchmark table") -> list[HalfTruthItem]:
    """Items from a benchmark table, checking columns and condition names."""
    missing = [
        n
        for n in BENCHMARK_SCHEMA.names
        if n not in table.column_names and n not in _OPTIONAL_COLUMNS
    ]
    if missing:
        raise DataError(f"{origin}: missing columns {missing}; expected {BENCHMARK_SCHEMA.names}")
    names = [n for n in BENCHMARK_SCHEMA.names if n in table.column_names]
    items = [
        HalfTruthItem(**{n: "" if row[n] is None else str(row[n]) for n in names})
        for row in table.select(names).to_pylist()
    ]
    for item in items:
        condition = CONDITION_BY_SLUG.get(item.condition)
        if condition is None or condition.group != item.group:
            raise DataError(
                f"{origin}: row for image {item.image_id!r} has condition "
                f"{item.condition!r} / group {item.group!r}; conditions are "
                f"{[(c.slug, c.group) for c in ALL_CONDITIONS]}"
            )
    return items


def save_benchmark(items: Sequence[HalfTruthItem], path: str | Path) -> Path:
    """Write items as Parquet (`.parquet`) or CSV (`.csv`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = items_to_table(items)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    elif path.suffix == ".csv":
        pacsv.write_csv(table, path)
    else:
        raise DataError(f"benchmark path {path}: use a .parquet or .csv file name")
    return path


def load_benchmark(path: str | Path) -> list[HalfTruthItem]:
    """Read items written by save_benchmark."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"benchmark table not found: {path}")
    if path.suffix == ".parquet":
        table = pq.read_table(path)
    elif path.suffix == ".csv":
        # Every column is text: stop pyarrow from guessing numbers in ids.
        options = pacsv.ConvertOptions(
            column_types={n: pa.string() for n in BENCHMARK_SCHEMA.names},
            strings_can_be_null=False,
        )
        table = pacsv.read_csv(path, convert_options=options)
    else:
        raise DataError(f"benchmark path {path}: use a .parquet or .csv file name")
    return table_to_items(table, origin=str(path))
