"""Every input, one answer: a flag the run would ignore, a file where a folder belongs,
weights of another model, unreadable replay answers or data files, Ctrl-C, and an
unfinished authors/ folder are each one line on stderr (exit 2, or 130 for Ctrl-C) or a
counted rejection, never a traceback and never a silent exit 0. The entry points run
in-process (`csclip.entry.<command>.main(argv)`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
import torch

import csclip.entry.evaluate
import csclip.entry.extract
import csclip.entry.train
from csclip.authors import read_authors_units, read_authors_uri, read_verbatim_records
from csclip.config.extract import BackendConfig
from csclip.entry import benchmark, evaluate, extract, train
from csclip.errors import CheckpointMismatch, DataError
from csclip.eval.zeroshot_paper import read_sun397
from csclip.extract import answers, authors_prompts, backends
from csclip.model import SPEC_FILE, create_bundle, read_spec
from csclip.report.paper import read_evaluation
from csclip.units import RejectReason

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # csclip.entry.common.LOG_FORMAT


def one_line(capsys) -> str:
    """The one non-log line the command wrote to stderr."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert len(lines) == 1, err
    return lines[0]


def _never_start_ray(*args, **kwargs):
    raise AssertionError("Ray started: the input should have been refused before")


# ---------------------------------------------------------------------------------------
# Flags the run would ignore
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "named"), [
    (["--data-root", "suites"], "--data-root"),
    (["--set", "suites.data_root=suites"], "suites.data_root"),
    (["--image-root", "images"], "--image-root"),
    (["--coco-images", "coco/val2017"], "--sugarcrepe"),
])
def test_evaluate_refuses_a_flag_it_would_ignore(argv, named, capsys):
    code = evaluate.main([*argv, "--print-config"])
    line = one_line(capsys)
    assert code == 2, line
    assert line.startswith("error: ") and named in line, line


def test_evaluate_takes_image_root_with_a_units_table(capsys):
    code = evaluate.main(["--units", "units.parquet", "--image-root", "images",
                          "--print-config"])
    assert code == 0, capsys.readouterr().err
    assert "image_root: images" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# --out naming a file
# ---------------------------------------------------------------------------------------

def test_an_output_folder_that_is_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(csclip.entry.extract, "init_ray", _never_start_ray)
    monkeypatch.setattr(csclip.entry.train, "init_ray", _never_start_ray)
    monkeypatch.setenv("CSCLIP_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out.txt"
    out.write_text("a file\n")
    captions = tmp_path / "captions.txt"
    captions.write_text("a red cube left of a blue sphere\n")
    for command, argv in [
        (evaluate, ["--model", "csclip-tiny", "--no-tracking"]),
        (extract, ["--backend", "rules", "--input", str(captions), "--no-tracking"]),
        (train, ["--model", "csclip-tiny", "--max-steps", "1", "--no-tracking"]),
    ]:
        code = command.main([*argv, "--out", str(out)])
        line = one_line(capsys)
        assert code == 2, line
        assert str(out) in line and "not a folder" in line, line


# ---------------------------------------------------------------------------------------
# Weights of another model
# ---------------------------------------------------------------------------------------

def test_weights_of_another_model_size_name_the_file_and_the_model(tmp_path):
    weights = tmp_path / "w128.pt"
    torch.save(create_bundle("csclip-tiny-w128").model.state_dict(), weights)
    with pytest.raises(CheckpointMismatch) as caught:
        create_bundle("csclip-tiny", str(weights))
    message = str(caught.value)
    assert str(weights) in message and "csclip-tiny" in message and "\n" not in message


# ---------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------

def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_is_one_line_saying_what_is_kept_and_exit_130(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(csclip.entry.extract, "init_ray", _interrupt)
    monkeypatch.setattr(csclip.entry.train, "init_ray", _interrupt)
    monkeypatch.setattr(csclip.entry.evaluate, "output_lease", _interrupt)
    captions = tmp_path / "captions.txt"
    captions.write_text("a red cube left of a blue sphere\n")
    for command, argv in [
        (extract, ["--backend", "rules", "--input", str(captions), "--out",
                   str(tmp_path / "units")]),
        (train, ["--model", "csclip-tiny", "--out", str(tmp_path / "runs")]),
        (evaluate, ["--model", "csclip-tiny", "--out", str(tmp_path / "eval")]),
    ]:
        code = command.main([*argv, "--no-tracking"])
        line = one_line(capsys)
        assert code == 130, line
        assert line.startswith("interrupted: ") and "rerun the same command" in line, line


# ---------------------------------------------------------------------------------------
# Replay answers
# ---------------------------------------------------------------------------------------

GOOD_ANSWER = json.dumps({"entities": [{"entity": "dog", "foils": [
    {"foil": "cat", "change_type": "object_change"}]}], "relations": []})


def _answer_line(sample_id: str, answer: object) -> bytes:
    return json.dumps({"kind": "extract", "sample_id": sample_id, "caption_index": 0,
                       "entity": None, "occurrence": 0, "answer": answer, "error": None,
                       "prompts": "csclip"}).encode() + b"\n"


def _replayed(answers_dir: Path, sample_ids: list[str]) -> dict[str, object]:
    """Each caption's replay Outcome, from the answers under `answers_dir`."""
    captions = pa.Table.from_pylist([
        {"sample_id": s, "image_id": s, "split": "train", "image_path": None,
         "image_bytes": None, "shard": 0, "caption_index": i, "caption": "A dog."}
        for i, s in enumerate(sample_ids)])
    backend = BackendConfig(name="replay", answers=str(answers_dir))
    rows = answers.attach_answers(captions, backend).to_pylist()
    return {row["sample_id"]: answers.replay_outcome(row) for row in rows}


def test_unreadable_replay_answers_are_counted_rejections(tmp_path):
    folder = tmp_path / "answers"
    folder.mkdir()
    not_utf8 = _answer_line("latin1", "PLACEHOLDER").replace(b"PLACEHOLDER", b"caf\xe9")
    deep = "[" * 200_000 + "]" * 200_000
    (folder / "part-0.jsonl").write_bytes(
        _answer_line("good", GOOD_ANSWER) + not_utf8 + _answer_line("number", 42)
        + _answer_line("object", {"entities": []}) + _answer_line("deep", deep))
    outcomes = _replayed(folder, ["good", "latin1", "number", "object", "deep"])
    assert outcomes["good"].record is not None
    for sample_id in ("latin1", "number", "object"):
        assert outcomes[sample_id].reason == RejectReason.INFERENCE_ERROR, sample_id
    assert "not UTF-8" in outcomes["latin1"].detail
    assert "not a string" in outcomes["number"].detail
    assert outcomes["deep"].reason == RejectReason.MALFORMED_JSON


def test_a_replay_answers_line_nested_past_the_parser_is_one_error(tmp_path):
    folder = tmp_path / "answers"
    folder.mkdir()
    (folder / "part-0.jsonl").write_bytes(_answer_line("good", GOOD_ANSWER)
                                          + b"[" * 200_000 + b"]" * 200_000 + b"\n")
    with pytest.raises(DataError, match=r"part-0\.jsonl:2: not an answer record"):
        _replayed(folder, ["good"])


# A live engine's answer (vllm) nested past the JSON parser: the caption's rejection with its
# reason, read by the same functions the engine's answers go through.
DEEP_ANSWER = "[" * 200_000 + "]" * 200_000


def test_a_live_answer_nested_past_the_parser_is_a_malformed_json_rejection():
    row = {"sample_id": "s-0", "image_id": "img", "caption": "A dog on a mat.", "shard": 0,
           "caption_index": 0, "split": "train", "image_path": None}
    outcome = backends.llm_outcome(row, DEEP_ANSWER, None)
    assert outcome.record is None and outcome.reason == RejectReason.MALFORMED_JSON
    assert "deeper than the JSON parser" in outcome.detail


@pytest.mark.parametrize("answer", [DEEP_ANSWER, "{" + '"a": [' * 100_000])
def test_an_authors_prompt_answer_nested_past_the_parser_gives_nothing_with_its_reason(answer):
    extraction = authors_prompts.read_extraction(answer)
    assert extraction.entities == [] and extraction.relations == []
    assert extraction.error_reason == RejectReason.MALFORMED_JSON and extraction.error


# ---------------------------------------------------------------------------------------
# Data files: a benchmark file, SUN397's class names, a model spec, an evaluation's table
# ---------------------------------------------------------------------------------------

def test_benchmark_verify_of_json_nested_past_the_parser_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    code = benchmark.main(["verify", str(path)])
    line = one_line(capsys)
    assert code == 2 and str(path) in line, line


def test_sun397_class_names_not_utf8_are_one_error_naming_the_file(tmp_path):
    folder = tmp_path / "SUN397"
    folder.mkdir()
    (folder / "ClassName.txt").write_bytes(b"/a/abbey\n/c/caf\xe9\n")
    with pytest.raises(DataError, match=r"ClassName\.txt: not UTF-8"):
        read_sun397(str(tmp_path))


@pytest.mark.parametrize("content", [b"[]", b"{}", b'{"name": "caf\xe9"}'])
def test_a_model_spec_that_is_no_spec_is_one_error_naming_the_file(content, tmp_path):
    (tmp_path / SPEC_FILE).write_bytes(content)
    with pytest.raises(CheckpointMismatch) as caught:
        read_spec(tmp_path)
    assert str(tmp_path / SPEC_FILE) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_table_row_longer_than_its_header_is_one_error_naming_the_file(tmp_path):
    (tmp_path / "table1.csv").write_text("label,model,pretrained,step,ht_accuracy\n"
                                         "CLIP,ViT-B-32,openai,,61.0,extra\n")
    with pytest.raises(DataError, match=r"table1\.csv: line 2 has 6 cells, its header 5"):
        read_evaluation("run", tmp_path)


# ---------------------------------------------------------------------------------------
# An unfinished `--out-format authors` extraction
# ---------------------------------------------------------------------------------------

AUTHORS_RELEASE = Path(__file__).parent / "fixtures" / "authors_eval.json"


def _killed_authors_extraction(out: Path) -> Path:
    """The output folder a `--prompts authors --out-format authors` run leaves when it is
    killed after the first of 7 shards (34 captions, 5 a shard): the manifest, shard 0's
    files and done marker, no _complete.json. Returns its authors/ folder."""
    (out / "_manifest.json").parent.mkdir(parents=True)
    (out / "_manifest.json").write_text(json.dumps({
        "input": {"uri": "captions.txt"}, "backend": "vllm", "shard_size": 5, "num_rows": 34,
        "first_sample_id": "a", "last_sample_id": "z", "prompts": "authors"}))
    for folder in ("authors", "_done", "units", "rejects"):
        (out / folder).mkdir()
    (out / "authors" / "part-00000.json").write_bytes(AUTHORS_RELEASE.read_bytes())
    (out / "_done" / "part-00000.json").write_text(json.dumps({"shard": 0, "read": 5}))
    return out / "authors"


def test_a_killed_authors_extraction_is_refused_by_every_reader(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(csclip.entry.extract, "init_ray", _never_start_ray)
    authors = _killed_authors_extraction(tmp_path / "killed")
    for uri in (authors, authors / "part-00000.json", f"{authors}/*.json"):
        with pytest.raises(DataError, match=r"stopped at shard 1 of 7; rerun the same command"):
            read_authors_uri(str(uri))
        with pytest.raises(DataError, match="unfinished extraction"):
            read_verbatim_records(str(uri))
    with pytest.raises(DataError, match="unfinished extraction"):
        read_authors_units([authors / "part-00000.json"])
    for command, argv in [
        (benchmark, ["build", "--units", str(authors), "--out", str(tmp_path / "b.json")]),
        (extract, ["--backend", "authors", "--input", str(authors), "--out",
                   str(tmp_path / "units"), "--no-tracking"]),
    ]:
        code = command.main(argv)
        line = one_line(capsys)
        assert code == 2, line
        assert str(authors) in line and "stopped at shard 1 of 7" in line, line
    assert not (tmp_path / "b.json").exists()


def test_a_finished_authors_extraction_and_the_authors_release_are_read(tmp_path):
    authors = _killed_authors_extraction(tmp_path / "finished")
    (tmp_path / "finished" / "_complete.json").write_text("{}")
    released = read_authors_uri(str(AUTHORS_RELEASE))
    assert released.records
    assert len(read_authors_uri(str(authors)).records) == len(released.records)
