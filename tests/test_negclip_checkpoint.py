"""The NegCLIP row as the paper's: `csclip evaluate --model ViT-B-32 --pretrained negCLIP.pt`
scores NegCLIP's released checkpoint, an open_clip training checkpoint (vinid/neg_clip
src/training/main.py:263-268: {"epoch", "name", "state_dict", "optimizer"}, the state
dict's keys "module."-prefixed under DistributedDataParallel, the optimizer's learning
rate a numpy float64 from open_clip's cosine schedule). Here a tiny model (csclip-tiny)
is written in exactly that format; the weights must really load (the same features and
the same scores as the source model), with the activation the paper's authors used unless
model.quick_gelu says otherwise; a truncated or foreign file is one line, exit 2."""

from __future__ import annotations

import csv
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # csclip.entry.common.LOG_FORMAT
# The smallest evaluation (tests/test_first_hour_eval.py's SMALL, without the model).
TINY = ["--set", "model.image_size=32", "--set", "data.world.num_val=4",
        "--set", "data.world.image_size=32", "--set", "benchmark.num_bootstrap=0",
        "--set", "benchmark.image_side=false", "--set", "suites.retrieval=false",
        "--set", "suites.num_world_pairs=0", "--set", "suites.num_zeroshot_items=0",
        "--set", "tracking.enabled=false"]


def _source(seed: int):
    from csclip.model import create_bundle

    torch.manual_seed(seed)
    return create_bundle("csclip-tiny", image_size=32)


def _write_negclip_format(model: torch.nn.Module, path: Path, ddp: bool = True) -> Path:
    """`model` saved as open_clip's training loop (NegCLIP's fork) saves a checkpoint."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    model.logit_scale.grad = torch.zeros_like(model.logit_scale)
    optimizer.step()  # per-parameter state (step, exp_avg, exp_avg_sq), as after training
    for group in optimizer.param_groups:
        group["lr"] = 0.5 * (1 + np.cos(np.pi * 0.5)) * 1e-6  # training/scheduler.py cosine_lr
    prefix = "module." if ddp else ""
    torch.save({"epoch": 5, "name": "negclip-tiny",
                "state_dict": {prefix + k: v for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict()}, path)
    model.logit_scale.grad = None
    return path


def _error_line(code: int, capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not LOG_LINE.match(line)]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_the_file_is_what_torch_refuses_without_numpy_allowed(tmp_path):
    # The format's numpy learning rate is why csclip reads the file itself: open_clip's
    # own loader (torch.load weights_only=True) refuses it.
    path = _write_negclip_format(_source(0).model, tmp_path / "negCLIP.pt")
    with pytest.raises(Exception, match="numpy"):
        torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("ddp", [True, False])
def test_the_weights_load_and_give_the_source_models_features(tmp_path, ddp, caplog):
    from open_clip.model import QuickGELU

    from csclip.model import create_bundle

    source = _source(0)
    path = _write_negclip_format(source.model, tmp_path / "negCLIP.pt", ddp=ddp)
    with caplog.at_level(logging.WARNING, logger="csclip.model"):
        loaded = create_bundle("csclip-tiny", str(path), image_size=32)
    assert "open_clip training checkpoint (epoch 5, run negclip-tiny)" in caplog.text
    assert "quick_gelu=False" in caplog.text
    assert not any(isinstance(m, QuickGELU) for m in loaded.model.modules())
    images = torch.randn(2, 3, 32, 32)
    texts = loaded.tokenizer(["a dog on a mat", "a mat on a dog"])
    with torch.no_grad():
        assert torch.equal(loaded.model.encode_image(images), source.model.encode_image(images))
        assert torch.equal(loaded.model.encode_text(texts), source.model.encode_text(texts))
        assert not torch.equal(_source(1).model.encode_image(images),
                               source.model.encode_image(images))
    # model.quick_gelu set: the activation asked for, and no guess logged.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="csclip.model"):
        quick = create_bundle("csclip-tiny", str(path), image_size=32, quick_gelu=True)
    assert any(isinstance(m, QuickGELU) for m in quick.model.modules())
    assert "training checkpoint" not in caplog.text
    assert torch.equal(quick.model.visual.conv1.weight, source.model.visual.conv1.weight)


def test_evaluate_scores_the_file_as_the_same_model_saved_by_csclip(tmp_path, capsys, caplog):
    from csclip.entry.evaluate import main
    from csclip.model import save_checkpoint, spec_of

    source = _source(0)
    negclip = _write_negclip_format(source.model, tmp_path / "negCLIP.pt")
    ours = tmp_path / "ours" / "final"
    save_checkpoint(source.model, spec_of(source.model, "csclip-tiny"), ours)
    other = _write_negclip_format(_source(1).model, tmp_path / "other.pt")

    def table1(run: str, pretrained: Path) -> dict[str, str]:
        # Table 1's scores: its one row less the columns that name the model.
        assert main(["--model", "csclip-tiny", "--pretrained", str(pretrained), *TINY,
                     "--out", str(tmp_path / run)]) == 0
        (row,) = csv.DictReader((tmp_path / run / "table1.csv").open())
        return {k: v for k, v in row.items() if k not in ("label", "model", "pretrained", "step")}

    with caplog.at_level(logging.WARNING, logger="csclip.model"):
        scores = table1("negclip", negclip)
    assert "quick_gelu=False" in caplog.text
    assert scores == table1("ours", ours)
    assert scores != table1("other", other)  # the scores depend on the weights loaded
    capsys.readouterr()


@pytest.mark.parametrize("damage", ["truncated", "not_torch"])
def test_a_damaged_file_is_one_line_exit_2(damage, tmp_path, capsys):
    from csclip.entry.evaluate import main

    path = _write_negclip_format(_source(0).model, tmp_path / "negCLIP.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"<html>quota</html>")
    line = _error_line(main(["--model", "csclip-tiny", "--pretrained", str(path), *TINY,
                             "--out", str(tmp_path / "eval")]), capsys)
    assert line.startswith(f"error: model.pretrained: {path} is not a readable weights file")


def test_a_checkpoint_of_another_model_is_one_line_exit_2(tmp_path, capsys):
    from csclip.entry.evaluate import main

    path = _write_negclip_format(_source(0).model, tmp_path / "negCLIP.pt")
    line = _error_line(main(["--model", "csclip-small", "--pretrained", str(path), *TINY,
                             "--out", str(tmp_path / "eval")]), capsys)
    assert line.startswith(f"error: {path}: not weights of csclip-small")
