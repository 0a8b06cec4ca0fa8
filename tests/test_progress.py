"""Progress you can see: csclip.progress (a bar on a terminal, log lines elsewhere), the
encoder's progress, the training's start and step lines, and the sweep's line per
finished trial. No Ray, no training."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest

from csclip import progress as progress_module
from csclip.progress import LogProgress, mode, progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_follows_the_terminal_and_the_environment(monkeypatch):
    monkeypatch.delenv("CSCLIP_PROGRESS", raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert mode() == "log"  # a log file, `ray job submit`: lines, not a bar
    monkeypatch.setattr("sys.stderr", Terminal())
    assert mode() == "bar"
    for value, expected in (("off", "off"), ("0", "off"), ("log", "log"), ("1", "bar"),
                            ("bar", "bar"), ("nonsense", "bar")):
        monkeypatch.setenv("CSCLIP_PROGRESS", value)
        assert mode() == expected, value


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "csclip.progress"]


def test_log_lines_every_tenth_and_a_closing_line(caplog):
    caplog.set_level(logging.INFO, logger="csclip.progress")
    clock = FakeClock()
    bar = LogProgress(None, "encode images", total=100, unit="image", clock=clock)
    for _ in range(100):
        clock.now += 0.5  # 50 s in all: every tenth is 5 s apart
        bar.update(1)
    bar.close()
    lines = _lines(caplog)
    # Nothing in the first SHOW_AFTER_S seconds, then one line a tenth, then "done".
    assert lines[0] == "encode images: 10/100 images (10%) in 5s, 2.0 images/s, ETA 45s"
    assert [line.split(" (")[1].split(")")[0] for line in lines[:-1]] == [
        f"{p}%" for p in range(10, 101, 10)]
    assert lines[-1] == "encode images: 100/100 images (100%) in 50s, 2.0 images/s, done"


def test_log_lines_are_silent_for_short_loops_and_beat_for_slow_ones(caplog):
    caplog.set_level(logging.INFO, logger="csclip.progress")
    clock = FakeClock()
    for _ in LogProgress(range(50), "quick", total=None, clock=clock):
        clock.now += 0.01
    assert _lines(caplog) == []
    slow = LogProgress(None, "replay: read answers", total=None, unit="file", clock=clock)
    for _ in range(5):
        clock.now += 20.0
        slow.update(1)
    slow.close()
    # No total: a line every LOG_EVERY_S seconds, and one at the end.
    assert _lines(caplog) == [
        "replay: read answers: 2 files in 40s, 0.1 files/s",
        "replay: read answers: 4 files in 1m20s, 0.1 files/s",
        "replay: read answers: 5 files in 1m40s, 0.1 files/s, done",
    ]
    caplog.clear()
    with pytest.raises(ValueError), LogProgress(None, "hash", total=10, clock=clock) as failing:
        clock.now += 5.0
        failing.update(1)
        raise ValueError("an unreadable image")
    assert [line.split(" in ")[0] for line in _lines(caplog)] == ["hash: 1/10 items (10%)"]
    clock.now = 0.0
    for index in LogProgress(range(10), "pass", total=10, clock=clock):
        clock.now += 5.0
        if index == 3:
            break  # a pass that has its samples stops early: said so, not "done"
    assert _lines(caplog)[-1].endswith(", ended early")


def test_bar_on_a_terminal_goes_to_stderr(monkeypatch, capsys):
    monkeypatch.setenv("CSCLIP_PROGRESS", "bar")
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    assert list(progress(range(3), desc="hash images", unit="image")) == [0, 1, 2]
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "hash images" in captured.err and "3/3" in captured.err


def test_encoder_features_show_progress_for_a_tiny_model(monkeypatch, caplog):
    from PIL import Image

    from csclip.eval.encoder import Encoder
    from csclip.model import create_bundle

    monkeypatch.setenv("CSCLIP_PROGRESS", "log")
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress_module, "LOG_MIN_GAP_S", 0.0)
    caplog.set_level(logging.INFO, logger="csclip.progress")
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buffer, format="PNG")
    encoder = Encoder.for_bundle(create_bundle("csclip-tiny", image_size=32))
    texts = [f"a red square number {k}" for k in range(5)]
    encoder.features(texts, {"a": buffer.getvalue(), "b": buffer.getvalue() + b""})
    lines = _lines(caplog)
    assert any(line.startswith("encode texts: 5/5 texts (100%)") for line in lines), lines
    assert any(line.startswith("encode images: 1/1 images (100%)") for line in lines), lines
    assert lines[-1].endswith(", done")


def test_training_start_line_says_what_is_trained():
    from csclip.config.train import TrainConfig
    from csclip.train.console import start_line, step_line
    from csclip.train.loop import run_name

    config = TrainConfig.model_validate({
        "model": {"name": "csclip-tiny"}, "optim": {"max_steps": 20},
        "data": {"batch_size": 8}, "run": {"num_workers": 2, "storage_path": "s3://b/runs",
                                           "log_every": 5}})
    name = run_name(config)
    assert start_line(config, name) == (
        f"train: run {name}: {config.loss.method} on csclip-tiny, 20 steps, batch 8 x 2 CPU "
        f"workers, data the synthetic world ({config.data.world.num_train} scenes), storage "
        f"s3://b/runs/{name}; a line every 5 steps")
    metrics = {"loss": 1.5, "loss_full": 1.0, "loss_unit": 0.25, "samples_per_s": 99.6,
               "data_wait_frac": 0.125}
    assert step_line("csclip", 5, 20, metrics, 1e-3) == (
        "csclip step 5/20 loss 1.5000 (full 1.0000 unit 0.2500) lr 1.00e-03 100 samples/s "
        "(data wait 12%)")


def test_sweep_prints_each_finished_trial():
    from csclip.ablation.console import TrialLines

    lines: list[str] = []
    callback = TrialLines(emit=lines.append)
    done = SimpleNamespace(config={"setting": "lr=1e-05"}, status="RUNNING", last_result={
        "ht_all": 62.34, "ht_entity": 70.0, "ht_relation": 55.5, "trial_train_seconds": 95.2,
        "trial_eval_seconds": 31.0, "step": 20})
    running = SimpleNamespace(config={"setting": "base"}, status="RUNNING", last_result={})

    def get_error():
        return RuntimeError("Traceback ...\nValueError: loss is nan")

    failed = SimpleNamespace(config={"setting": "lr=1"}, status="RUNNING", get_error=get_error)
    callback.on_trial_complete(3, [running, done, failed], done)  # its status not yet set
    done.status = "TERMINATED"
    callback.on_trial_error(4, [running, done, failed], failed)
    assert lines == [
        "ablate: trial 1/3 done: lr=1e-05: HT All 62.3, HT Ent 70.0, HT Rel 55.5 "
        "(train 95 s, eval 31 s)",
        "ablate: trial 2/3 failed: lr=1: ValueError: loss is nan",
    ]
