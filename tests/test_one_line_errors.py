"""Every input, one answer: a flag the run would ignore, a file where a folder belongs,
weights of another model, unreadable replay answers or data files, Ctrl-C, and an
unfinished authors/ folder are each one line on stderr (exit 2, or 130 for Ctrl-C) or a
counted rejection, never a traceback and never a silent exit 0. The entry points run
in-process (`csclip.entry.<command>.main(argv)`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import csclip.entry.evaluate
import csclip.entry.extract
import csclip.entry.train
from csclip.entry import evaluate, extract, train
from csclip.errors import CheckpointMismatch
from csclip.model import create_bundle

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
