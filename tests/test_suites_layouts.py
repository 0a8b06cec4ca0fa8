"""Each benchmark in the layout its repository or hub release ships (tests/fixtures/suites/
published: real slices where the repository has annotation files, else records rebuilt
from the official loader): every record accounted for (read = scored + skipped with a
reason), a missing image one line by default and a counted skip with allow_partial, and
the report's per-benchmark rows."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from suites_helpers import FIXTURES, CaptionLengthScorer, ColorScorer

from csclip.eval.encoder import Encoder
from csclip.eval.report import HalfTruthReport, benchmark_tables
from csclip.eval.suites.core import IncompleteBenchmark, check_complete, evaluate_suite_data
from csclip.eval.suites.registry import BENCHMARKS, evaluate_benchmarks, load_benchmarks

PUBLISHED = FIXTURES / "published"
ROOT = str(PUBLISHED)
SUGARCREPE = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att",
              "swap_obj")
SUGARCREPE_PP = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
VALSE = ("existence", "plurals", "counting-hard", "counting-small-quant", "counting-adversarial",
         "relations", "action-replacement", "actant-swap", "coreference-standard",
         "coreference-hard", "foil-it")


def records(path) -> list:
    """The records of a published JSON file, in its order (object values or list items)."""
    rows = json.loads(path.read_text())
    return list(rows.values()) if isinstance(rows, dict) else rows


def valse_validated(row: dict) -> bool:
    return row["mturk"]["caption"] >= 2


def expected_accounting() -> dict[str, dict[str, tuple[int, dict[str, int]]]]:
    """benchmark -> subset -> (records read, skips by reason), counted here from the files."""
    valse = {}
    for piece in VALSE:
        rows = records(PUBLISHED / "valse" / "data" / f"{piece}.json")
        invalid = sum(not valse_validated(r) for r in rows)
        valse[piece.replace("-", "_")] = (len(rows), {"not_validated": invalid} if invalid else {})
    whatsup = PUBLISHED / "whatsup" / "data"
    return {
        "sugarcrepe": {s: (len(records(PUBLISHED / "sugarcrepe" / "data" / f"{s}.json")), {})
                       for s in SUGARCREPE},
        "sugarcrepe_pp": {s: (len(records(PUBLISHED / "sugarcrepe_pp" / "data" / f"{s}.json")),
                              {}) for s in SUGARCREPE_PP},
        "valse": valse,
        "cola": {"multi_objects": (3, {})},
        "whatsup": {s: (len(records(whatsup / f)), {}) for s, f in (
            ("controlled_a", "controlled_images_dataset.json"),
            ("controlled_b", "controlled_clevr_dataset.json"),
            ("coco_one", "coco_qa_one_obj.json"), ("coco_two", "coco_qa_two_obj.json"),
            ("vg_one", "vg_qa_one_obj.json"), ("vg_two", "vg_qa_two_obj.json"))},
        "coco_cf": {"all": (3, {})},
        "colorswap": {"all": (len(records(PUBLISHED / "colorswap" / "data" / "test.json")), {})},
        "bla": {"active_passive": (2, {}), "coordination": (2, {}),
                "relative_clause": (2, {"malformed_record": 1})},
        "svo_probes": {"subj_neg": (1, {}), "verb_neg": (1, {}), "obj_neg": (1, {})},
    }


EXPECTED = expected_accounting()


@pytest.mark.parametrize("benchmark", sorted(EXPECTED))
def test_published_layout_loads_with_every_record_accounted_for(benchmark):
    data = BENCHMARKS[benchmark](ROOT)
    check_complete(data)  # every image the records name is there: no error by default
    expected = EXPECTED[benchmark]
    assert data.read() == {s: n for s, (n, _) in expected.items()}
    reasons = {s: {r: c for (subset, r), c in data.skip_counts.items() if subset == s}
               for s in expected}
    assert reasons == {s: r for s, (_, r) in expected.items()}
    scored = data.scored()
    for subset, (read, skips) in expected.items():
        assert scored.get(subset, 0) == read - sum(skips.values()), subset


def test_whatsup_reads_the_repository_layout_all_fifteen_items():
    metrics, _ = evaluate_suite_data(Encoder(CaptionLengthScorer()), BENCHMARKS["whatsup"](ROOT))
    assert sum(metrics[f"whatsup_{s}_num"] for s in EXPECTED["whatsup"]) == 15
    assert metrics["whatsup_controlled_a_num"] == metrics["whatsup_controlled_b_num"] == 4


def test_whatsup_pointed_at_its_data_folder_itself(tmp_path):
    shutil.copytree(PUBLISHED / "whatsup" / "data", tmp_path / "whatsup")
    data = BENCHMARKS["whatsup"](str(tmp_path))
    check_complete(data)
    assert sum(data.scored().values()) == 15


def test_colorswap_json_release_scores_the_test_split_only():
    data = BENCHMARKS["colorswap"](ROOT)
    ids = {p.image_0.rsplit("/", 1)[-1] for p in data.pairs}
    assert ids == {"img_0_1.png", "img_1_1.png", "img_2_1.png"}  # train's 3 and 4 are not in


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


def _colorswap_parquet(path, ids, image_1=None) -> None:
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    first = [{"bytes": image_1 if image_1 is not None and k == ids[0] else _png(), "path": None}
             for k in ids]
    pq.write_table(pa.table({
        "id": pa.array(list(ids)),
        "image_1": pa.array(first, image_type),
        "image_2": pa.array([{"bytes": _png(), "path": None} for _ in ids], image_type),
        "caption_1": [f"caption {k} a" for k in ids], "caption_2": [f"caption {k} b" for k in ids],
    }), path)


def test_colorswap_parquet_reads_the_test_split_not_every_file(tmp_path):
    folder = tmp_path / "colorswap" / "data"
    folder.mkdir(parents=True)
    _colorswap_parquet(folder / "test-00000-of-00001.parquet", [0, 1])
    _colorswap_parquet(folder / "train-00000-of-00001.parquet", [10, 11, 12])
    data = BENCHMARKS["colorswap"](str(tmp_path))
    assert data.read() == {"all": 2}
    assert all("colorswap/1" in p.image_0 or "colorswap/0" in p.image_0 for p in data.pairs)


def test_colorswap_parquet_row_without_image_bytes_is_an_unreadable_image(tmp_path):
    folder = tmp_path / "colorswap" / "data"
    folder.mkdir(parents=True)
    _colorswap_parquet(folder / "test-00000-of-00001.parquet", [0, 1], image_1=b"")
    data = BENCHMARKS["colorswap"](str(tmp_path))
    assert data.skip_counts == {("all", "unreadable_image"): 1} and data.read() == {"all": 2}
    with pytest.raises(IncompleteBenchmark, match="unreadable"):
        check_complete(data)


def test_sugarcrepe_real_slice_caption_length_known_answer():
    metrics, _ = evaluate_suite_data(Encoder(CaptionLengthScorer()), BENCHMARKS["sugarcrepe"](ROOT))
    for subset in SUGARCREPE:
        rows = records(PUBLISHED / "sugarcrepe" / "data" / f"{subset}.json")
        # The longer text wins with this scorer; a tie (same length) is wrong (strict).
        expected = 100 * np.mean([len(r["caption"]) > len(r["negative_caption"]) for r in rows])
        assert metrics[f"sugarcrepe_{subset}_i2t"] == pytest.approx(expected), subset


def test_sugarcrepe_pp_and_valse_real_slices_known_answers():
    encoder = Encoder(CaptionLengthScorer())
    metrics, _ = evaluate_suite_data(encoder, BENCHMARKS["sugarcrepe_pp"](ROOT))
    for subset in SUGARCREPE_PP:
        rows = records(PUBLISHED / "sugarcrepe_pp" / "data" / f"{subset}.json")
        expected = 100 * np.mean([min(len(r["caption"]), len(r["caption2"]))
                                  > len(r["negative_caption"]) for r in rows])
        assert metrics[f"sugarcrepe_pp_{subset}_i2t"] == pytest.approx(expected), subset
    metrics, _ = evaluate_suite_data(encoder, BENCHMARKS["valse"](ROOT))
    for piece in VALSE:
        rows = [r for r in records(PUBLISHED / "valse" / "data" / f"{piece}.json")
                if valse_validated(r)]
        expected = 100 * np.mean([len(r["caption"]) > len(r["foil"]) for r in rows])
        assert metrics[f"valse_{piece.replace('-', '_')}_i2t"] == pytest.approx(expected), piece


def _without(tmp_path, benchmark: str, image: str):
    shutil.copytree(PUBLISHED / benchmark, tmp_path / benchmark)
    (tmp_path / benchmark / image).unlink()
    return str(tmp_path)


def test_missing_image_is_one_line_naming_layout_and_found(tmp_path):
    root = _without(tmp_path, "whatsup", "data/controlled_images/mug_on_plate.jpeg")
    with pytest.raises(IncompleteBenchmark) as error:
        load_benchmarks(["whatsup"], root)
    message = str(error.value)
    assert "\n" not in message
    assert "whatsup: 1 of 15 records" in message and "controlled_a 1" in message
    assert "mug_on_plate.jpeg" in message  # the missing file
    assert "expects the repository's data/ folder" in message  # the layout
    assert "found under" in message and "data/" in message  # what is there
    assert "--allow-partial" in message


def test_missing_image_with_allow_partial_is_a_counted_skip(tmp_path):
    root = _without(tmp_path, "whatsup", "data/controlled_images/mug_on_plate.jpeg")
    metrics = evaluate_benchmarks(Encoder(CaptionLengthScorer()), ["whatsup"], root,
                                  allow_partial=True)
    assert metrics["whatsup_controlled_a_read"] == 4
    assert metrics["whatsup_controlled_a_num"] == 3
    assert metrics["whatsup_controlled_a_skipped_missing_image"] == 1
    assert metrics["whatsup_controlled_b_num"] == 4


def test_empty_image_file_is_an_unreadable_image(tmp_path):
    shutil.copytree(PUBLISHED / "coco_cf", tmp_path / "coco_cf")
    (tmp_path / "coco_cf" / "data" / "cf1_0.jpg").write_bytes(b"")
    data = BENCHMARKS["coco_cf"](str(tmp_path))
    assert data.skip_counts == {("all", "unreadable_image"): 1}
    with pytest.raises(IncompleteBenchmark, match="1 of 3 records"):
        check_complete(data)


def test_report_rows_per_benchmark_do_not_borrow_a_longer_names_subsets():
    metrics = evaluate_benchmarks(Encoder(CaptionLengthScorer()), ["sugarcrepe", "sugarcrepe_pp"],
                                  ROOT)
    report = HalfTruthReport("m", metrics, (), None)  # the tables read metrics only
    rows = benchmark_tables({"m": report})["benchmarks"].rows
    subsets = {b: [r[2] for r in rows if r[1] == b and r[2] != "(benchmark)"]
               for b in ("sugarcrepe", "sugarcrepe_pp")}
    assert subsets == {"sugarcrepe": sorted(SUGARCREPE), "sugarcrepe_pp": sorted(SUGARCREPE_PP)}
    # The accounting columns: read = scored + skipped.
    row = next(r for r in rows if r[1] == "sugarcrepe" and r[2] == "add_att")
    assert row[6:9] == (3.0, 3.0, 0.0)


def test_allow_partial_flag_sets_the_config_field():
    from csclip.entry.evaluate import overrides_from_args, parse_args

    assert "suites.allow_partial=true" in overrides_from_args(parse_args(["--allow-partial"]))
    assert not any("allow_partial" in o for o in overrides_from_args(parse_args([])))


def test_accounting_reaches_mlflow_with_the_benchmarks_table(tmp_path, mlflow_uri):
    import mlflow

    from csclip.eval.report import log_comparison

    root = _without(tmp_path, "bla", "bla_benchmark/images/coordination_1.jpg")
    metrics = evaluate_benchmarks(Encoder(CaptionLengthScorer()), ["bla"], root, allow_partial=True)
    table = benchmark_tables({"m": HalfTruthReport("m", metrics, (), None)})["benchmarks"]
    files = table.write(tmp_path, "benchmarks")
    run_id = log_comparison({"m": HalfTruthReport("m", metrics, (), None)}, files, mlflow_uri)
    logged = mlflow.MlflowClient(mlflow_uri).get_run(run_id).data.metrics
    assert logged["bla_relative_clause_skipped_malformed_record"] == 1
    assert logged["bla_coordination_skipped_missing_image"] == 1
    assert logged["bla_coordination_read"] == 2 and logged["bla_coordination_num"] == 1
    assert "| m | bla | coordination |" in (tmp_path / "benchmarks.md").read_text()


def test_a_quick_look_scores_n_items_and_still_reports_the_files_counts():
    data = BENCHMARKS["whatsup"](ROOT).limit(1)
    metrics, _ = evaluate_suite_data(Encoder(CaptionLengthScorer()), data)
    assert metrics["whatsup_controlled_a_num"] == 1 and metrics["whatsup_controlled_a_read"] == 4


def test_a_corrupt_image_is_one_line_naming_the_file(tmp_path):
    # A file that is there and not empty but does not decode: not a PIL traceback.
    from csclip.errors import DataError
    from csclip.eval.encoder import encode_features

    good = tmp_path / "good.png"
    Image.new("RGB", (4, 4), (255, 0, 0)).save(good)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    features = encode_features(ColorScorer(), ["a red square"], {"good": str(good)})
    assert features.image_index == {"good": 0}
    with pytest.raises(DataError, match=r"bad\.jpg: not a readable image"):
        encode_features(ColorScorer(), ["a red square"], {"good": str(good), "bad": str(bad)})
