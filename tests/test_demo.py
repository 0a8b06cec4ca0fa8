"""The demo as a newcomer meets it: images decoded once and the same batches as
streaming them; the stage timings; a log with no warning and no traceback."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from csclip.config.train import SamplingConfig
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError
from csclip.train.stream import (
    decode_batch,
    image_shape,
    prepare_batch,
    preprocess_key,
    sample_batch,
)
from csclip.units import records_to_table
from csclip.world import world_record
from tests.conftest import REPO_ROOT

CSCLIP_COLUMNS = ["caption", "caption_negative", "unit_0", "foil_0", "unit_1", "foil_1"]
IMAGE_FOIL_COLUMNS = ["image_foil_unit", "image_foil_text"]  # loss.image_foils' (the demo's)


@pytest.fixture(scope="module")
def preprocess() -> dict:
    from csclip.model import create_bundle, spec_of

    return spec_of(create_bundle("csclip-tiny", image_size=32).model, "csclip-tiny").preprocess_cfg


def _table(size: int, broken: tuple[int, ...] = ()) -> pa.Table:
    table = records_to_table([world_record(WorldConfig(image_size=32), "train", i)
                              for i in range(size)])
    rows = table.to_pylist()
    for index in broken:
        rows[index]["image_bytes"] = b"not a png"
    return pa.Table.from_pylist(rows, schema=table.schema)


def _stream_kwargs(preprocess: dict, epoch: int, columns) -> dict:
    return {"sampling": SamplingConfig(relation_prob=0.5).model_dump(mode="json"),
            "model_name": "csclip-tiny", "seed": 3, "epoch": epoch, "columns": columns}


@pytest.mark.parametrize("columns", [["caption"], CSCLIP_COLUMNS])
def test_decoded_once_then_sampled_equals_decoding_every_epoch(preprocess, columns):
    table = _table(9, broken=(4,))
    decoded = decode_batch(table, preprocess=preprocess_key(preprocess), model_name="csclip-tiny")
    assert decoded.num_rows == 8  # the undecodable row is dropped, as before
    for epoch in (0, 1):
        kwargs = _stream_kwargs(preprocess, epoch, columns)
        cached = sample_batch(decoded, image_shape=image_shape(preprocess), **kwargs)
        streamed = prepare_batch(table, preprocess=preprocess_key(preprocess), **kwargs)
        assert cached.keys() == streamed.keys()
        for name in cached:
            assert cached[name].dtype == streamed[name].dtype
            np.testing.assert_array_equal(cached[name], streamed[name])
    assert cached["image"].shape == (8, 3, 32, 32)


@pytest.mark.parametrize("columns", [["caption", *IMAGE_FOIL_COLUMNS],
                                     CSCLIP_COLUMNS + IMAGE_FOIL_COLUMNS])
@pytest.mark.parametrize("normalize", [False, True])
def test_cached_image_foils_are_the_streamed_ones(preprocess, columns, normalize):
    # The demo's pretraining and CS-CLIP: every candidate foil rendered once into the cache,
    # and each epoch draws the one the streamed path draws and renders.
    table = _table(12, broken=(4,))
    key = preprocess_key(preprocess)
    decoded = decode_batch(table, preprocess=key, model_name="csclip-tiny", pixels=True,
                           image_foils=True)
    drawn = set()
    for epoch in range(3):
        kwargs = {**_stream_kwargs(preprocess, epoch, columns), "normalize": normalize}
        cached = sample_batch(decoded, image_shape=image_shape(preprocess), preprocess=key,
                              **kwargs)
        streamed = prepare_batch(table, preprocess=key, **kwargs)
        assert cached.keys() == streamed.keys() >= {"image_foil", "image_foil_mask"}
        for name in cached:
            assert cached[name].dtype == streamed[name].dtype, name
            np.testing.assert_array_equal(cached[name], streamed[name], err_msg=name)
        assert cached["image_foil"].dtype == (np.float32 if normalize else np.uint8)
        drawn.add(cached["image_foil_unit"].tobytes())
    assert cached["image_foil_mask"].any() and len(drawn) > 1  # foils, drawn anew each epoch
    assert not (cached["image_foil"] == cached["image"]).all(axis=(1, 2, 3))[
        cached["image_foil_mask"]].any()  # a foil is another image than its own


def test_units_are_drawn_again_every_epoch_from_the_cached_rows(preprocess):
    decoded = decode_batch(_table(16), preprocess=preprocess_key(preprocess),
                           model_name="csclip-tiny")
    first, second = (sample_batch(decoded, image_shape=image_shape(preprocess),
                                  **_stream_kwargs(preprocess, epoch, CSCLIP_COLUMNS))
                     for epoch in (0, 1))
    np.testing.assert_array_equal(first["image"], second["image"])
    np.testing.assert_array_equal(first["caption"], second["caption"])
    assert not np.array_equal(first["unit_0"], second["unit_0"])


def test_the_demo_is_three_deltas_on_the_fine_tuning_config():
    # the layout warm start on top of the pretraining, the pretraining and the
    # fine-tunings on top of `train`: each a TrainConfig like any other run's.
    from csclip.config import load_config
    from csclip.config.demo import DemoConfig

    demo = load_config(DemoConfig, None, ["warm_start.optim.max_steps=3",
                                          "pretrain.data.world.num_train=96"])
    warm, pre = demo.warm_start_config(), demo.pretrain_config("/warm/final")
    assert warm.loss.method == "layout" and warm.optim.max_steps == 3
    assert (warm.optim.schedule, warm.optim.grad_clip, warm.optim.lr) == ("constant", None, 1e-3)
    assert warm.data.world == pre.data.world and pre.data.world.num_train == 96
    assert pre.data.world.seed != demo.train.data.world.seed
    assert warm.model.pretrained is None and not warm.model.lock.image
    assert pre.model.pretrained == "/warm/final" and pre.model.lock.image  # LiT on the warm tower
    assert pre.loss.method == "clip" and pre.loss.image_foil_weight == 2.0  # ours
    # Both fine-tunings train the text tower only; CS-CLIP alone gets the image foils.
    cs_clip, clip_ft = (demo.finetune_config(m, "/ckpt") for m in ("csclip", "clip"))
    assert cs_clip.model.lock.image and clip_ft.model.lock.image
    assert cs_clip.loss.image_foil_weight == 2.0 and clip_ft.loss.image_foil_weight is None
    assert cs_clip.model.pretrained == clip_ft.model.pretrained == "/ckpt"
    # One field each: μ = 0 (or null) turns the foils off, the lock is the model's.
    off = load_config(DemoConfig, None, ["finetune.loss.image_foil_weight=0"])
    assert not off.finetune_config("csclip", "/ckpt").loss.image_foils
    unlocked = load_config(DemoConfig, None, ["finetune.model.lock.image=false"])
    assert not unlocked.finetune_config("clip", "/ckpt").model.lock.image


def test_both_fine_tunings_at_once_where_the_cpus_allow():
    from csclip.config import load_config
    from csclip.config.demo import DemoConfig
    from csclip.demo import METHODS, side_by_side
    from csclip.train.identity import run_name

    demo = load_config(DemoConfig, None, [])
    configs = {label: demo.finetune_config(method, "/ckpt") for label, method in METHODS.items()}
    # 2 CPUs: a quarter CPU each, 1.5 left to Ray Data; each keeps its one torch thread
    together = side_by_side(configs, 2.0)
    assert set(together) == {"CLIP-FT", "CS-CLIP"}
    for label, config in together.items():
        assert (config.run.cpus_per_worker, config.run.torch_threads) == (0.25, 1)
        # how it runs, not what it is: the same runs, caches and resumption
        assert run_name(config) == run_name(configs[label])
        assert config.model_dump(exclude={"run"}) == configs[label].model_dump(exclude={"run"})
    # enough CPUs: each keeps its own reservation
    assert {c.run.cpus_per_worker for c in side_by_side(configs, 16.0).values()} == {1.0}
    # one after the other: too few CPUs for both and Ray Data, or a GPU each
    assert side_by_side(configs, 1.9) is None
    gpu = {label: c.model_copy(update={"run": c.run.model_copy(update={"use_gpu": True})})
           for label, c in configs.items()}
    assert side_by_side(gpu, 16.0) is None
    assert side_by_side({"CS-CLIP": configs["CS-CLIP"]}, 16.0) is None
    assert not load_config(DemoConfig, None, ["finetune_together=false"]).finetune_together


def test_no_warm_start_is_one_flag_and_a_random_locked_tower_is_refused():
    from csclip.config import load_config
    from csclip.config.demo import DemoConfig
    from csclip.entry.demo import build_parser, demo_config

    cold = demo_config(build_parser().parse_args(["--layout-steps", "0"]))
    assert cold.warm_start is None and not cold.pretrain_config().model.lock.image
    assert not cold.finetune_config("csclip", "/ckpt").model.lock.image
    with pytest.raises(ConfigError, match="pretrain.model.lock.image=false"):
        load_config(DemoConfig, None, ["warm_start=null"])


@pytest.mark.parametrize("override,field", [
    ("pretrain.run.name=mine", "pretrain.run.name"),
    ("pretrain.model.pretrained=/x", "pretrain.model.pretrained"),
    ("finetune.loss.method=clip", "finetune.loss.method"),
    ("finetune.model.pretrained=/x", "finetune.model.pretrained"),
    ("warm_start.run.name=mine", "warm_start.run.name"),
    ("pretrain.optim.max_steps=0", "pretrain.optim.max_steps"),   # a delta's bad value
    ("warm_start.loss.image_foil_weight=1", "warm_start"),
    # the knobs before one field per idea: each names its new field
    ("lock_image=false", "finetune.model.lock.image"),
    ("image_foil_weight=1", "finetune.loss.image_foil_weight"),
    ("train.loss.image_foils=true", "loss.image_foil_weight"),
    ("train.model.lock_image=true", "model.lock.image"),
    ("pretrain.layout_steps=3", "warm_start.optim.max_steps"),
])
def test_the_demo_refuses_what_it_sets_itself_and_the_old_fields_in_one_line(override, field):
    from csclip.config import load_config
    from csclip.config.demo import DemoConfig

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as raised:
        load_config(DemoConfig, None, [override])
    assert "\n" not in str(raised.value)


def test_stage_table_and_its_section(tmp_path):
    from csclip.demo import StageTime, stage_table, stages_section

    stages = [StageTime("start Ray", 4.2),
              StageTime("pretrain", 100.4, 800, 64, 512.3, 0.031),
              StageTime("CLIP-FT", 10.0, 600, 64, cached=True)]
    table = stage_table(stages, 114.6)
    assert "| pretrain | 100 | 800 | 64 | 512 | 3% |" in table
    assert "| CLIP-FT | 10 | cached | 64 |  |  |" in table
    assert "| **total** | 115 |" in table
    text = stages_section(stages, 114.6, "csclip demo")
    assert text.count("## The demo, stage by stage") == 1 and table in text
    assert "load average" in text and "`csclip demo`" in text


@pytest.mark.slow
def test_demo_log_holds_no_warning_and_no_traceback(tmp_path):
    """The demo's entry point, on a tiny world and a few steps per stage, in a fresh
    process (its own local Ray, started as the demo starts it)."""
    # As a user starts it: without the test session's Ray settings (tests/conftest.py).
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_DATA_DISABLE_PROGRESS_BARS")}
    overrides = [
        "train.data.world.num_train=96", "train.data.world.num_val=24",
        "train.data.batch_size=16", "train.optim.warmup_steps=1",
        "train.run.checkpoint_every=3", "train.run.log_every=2",
        f"train.run.storage_path={tmp_path / 'train'}",
        f"train.tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        "pretrain.data.world.num_train=96", "pretrain.data.batch_size=16",
        "pretrain.optim.warmup_steps=1", f"pretrain.run.storage_path={tmp_path / 'pretrain'}",
    ]
    command = [sys.executable, "-m", "csclip.cli", "demo", "--max-steps", "4",
               "--pretrain-steps", "4", "--layout-steps", "3", "--out", str(tmp_path / "demo")]
    for override in overrides:
        command += ["--set", override]
    log_file = tmp_path / "demo.log"
    before = _git_status()
    with log_file.open("w") as out:
        # Minutes on a quiet machine (Ray and three training runs start); generous for a
        # shared one.
        code = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=1800).returncode
    log = log_file.read_text()
    assert code == 0, log[-3000:]
    bad = [line for line in log.splitlines() if "WARNING" in line or "Traceback" in line]
    assert not bad, "\n".join(bad)
    # two CPUs: the fine-tunings ran at once (csclip.demo.side_by_side)
    assert "(both fine-tunings at once)" in log
    assert "| CS-CLIP (at once with CLIP-FT) |" in (tmp_path / "demo" / "demo_stages.md").read_text()
    for stage in ("[1/4] pretraining", "layout step 2/3", "held-out objects in their cell", "[2/4] fine-tuning CLIP-FT", "[3/4] fine-tuning CS-CLIP",
                  "[4/4] half-truth evaluation", "| CS-CLIP |", "csclip step 4/4",
                  "mlflow ui --backend-store-uri"):
        assert stage in log
    # CS-CLIP's step lines show the image-foil term (ours); the table of Ant and
    # Swap's win rates with their intervals is printed.
    assert any("csclip step" in line and "image_foil" in line for line in log.splitlines())
    assert "| Model | Ant | Ant CI low | Ant CI high | Swap | Swap CI low | Swap CI high |" in log
    assert (tmp_path / "demo" / "figure3.png").exists()
    # Everything it wrote is under --out: the tracked docs change only when published.
    assert (tmp_path / "demo" / "demo_results.md").is_file()
    assert "| **total** |" in (tmp_path / "demo" / "demo_stages.md").read_text()
    assert _git_status() == before  # no tracked file rewritten


def _git_status() -> str | None:
    """`git status --porcelain` of the checkout (None outside one)."""
    done = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                          text=True)
    return done.stdout if done.returncode == 0 else None


def test_publish_is_a_command_that_trains_nothing(tmp_path, capsys, monkeypatch):
    from csclip.demo import RESULTS_SECTION, STAGES_SECTION
    from csclip.entry.demo import main
    from csclip.eval.report import EVALUATION_COMPLETE

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "demo"
    assert main(["--publish", "--out", str(out)]) == 2  # nothing to publish: one line
    assert "run the demo first" in capsys.readouterr().err
    out.mkdir(parents=True)
    (out / RESULTS_SECTION).write_text("## The demo\n| table |\n")
    (out / STAGES_SECTION).write_text("## The demo, stage by stage\n| stages |\n")
    (out / "table1.csv").write_text("Model,Overall\n")
    # Sections beside an evaluation that never finished (no marker): refused.
    assert main(["--publish", "--out", str(out)]) == 2
    assert "did not finish" in capsys.readouterr().err
    table = (out / "table1.csv").read_bytes()
    (out / EVALUATION_COMPLETE).write_text(json.dumps({"files": {"table1.csv": {
        "size": len(table), "sha256": hashlib.sha256(table).hexdigest()}}}))
    assert main(["--publish", "--out", str(out)]) == 0
    assert "| table |" in (tmp_path / "docs" / "results.md").read_text()
    assert "| stages |" in (tmp_path / "docs" / "performance.md").read_text()
    assert not (tmp_path / "runs" / "train").exists()  # nothing was trained
