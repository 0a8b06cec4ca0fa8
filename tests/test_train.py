"""Training: schedule, loss wiring, data preparation, and real Ray Train runs (one real
2-worker gloo run; resumption after a kill; MLflow logging; the exported checkpoint)."""

from __future__ import annotations

import io
import platform

import cluster_harness as harness
import open_clip
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from train_helpers import compute_loss, read_loss_log

from csclip.config import load_config
from csclip.config.loss import LossConfig
from csclip.config.train import DataConfig, RunSection, SamplingConfig, TrainConfig
from csclip.config.world import WorldConfig
from csclip.errors import CsclipError, DataError
from csclip.loss import objective_for
from csclip.model import WEIGHTS_FILE, create_bundle, spec_of
from csclip.model_configs import register_small_models
from csclip.shards.write import REJECTS_FILE
from csclip.train.loop import (
    WorkerHooks,
    check_data_cpus,
    finished_result,
    run,
    run_name,
)
from csclip.train.shards import plan_shards
from csclip.train.source_shards import source_shards
from csclip.train.stream import plan_steps, prepare_batch, preprocess_key
from csclip.units import records_to_table
from csclip.world import world_record

TINY_WORLD = WorldConfig(image_size=32, num_train=48, num_val=8, num_test=8)


def tiny_config(tmp_path, mlflow_uri: str, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", "data.world.image_size=32",
        "data.world.num_train=48", "data.batch_size=8", "data.shuffle_buffer=16",
        "optim.max_steps=4", "optim.warmup_steps=1", "optim.lr=1e-4",
        "run.checkpoint_every=2", "run.log_every=1",
        f"run.storage_path={tmp_path / 'runs'}", f"tracking.uri={mlflow_uri}", *overrides])


# ---------------------------------------------------------------------------------------
# Pure pieces
# ---------------------------------------------------------------------------------------

def _batch(model_name: str = "csclip-tiny", size: int = 6, slots: int = 2) -> dict:
    world = WorldConfig(image_size=32)
    records = [world_record(world, "train", i) for i in range(size)]
    spec = spec_of(create_bundle(model_name, image_size=32).model, model_name)
    columns = prepare_batch(records_to_table(records), sampling=SamplingConfig(
        num_unit_slots=slots).model_dump(), preprocess=preprocess_key(spec.preprocess_cfg),
        model_name=model_name, seed=0, epoch=0)
    return {k: torch.as_tensor(v) for k, v in columns.items()}


def test_prepare_batch_gives_images_tokens_and_mask():
    batch = _batch(size=5, slots=3)
    assert batch["image"].shape == (5, 3, 32, 32)
    for name in ["caption", "caption_negative", "unit_0", "unit_2", "foil_2"]:
        assert batch[name].shape == (5, 32) and batch[name].dtype == torch.int64
    assert batch["unit_mask"].dtype == torch.bool
    assert batch["negative_mask"].dtype == torch.bool and batch["negative_mask"].shape == (5,)
    assert not torch.equal(batch["unit_0"], batch["foil_0"])


def test_clip_batches_carry_only_the_caption():
    world = WorldConfig(image_size=32)
    records = [world_record(world, "train", i) for i in range(3)]
    spec = spec_of(create_bundle("csclip-tiny", image_size=32).model, "csclip-tiny")
    out = prepare_batch(records_to_table(records), sampling=SamplingConfig().model_dump(),
                        preprocess=preprocess_key(spec.preprocess_cfg), model_name="csclip-tiny",
                        seed=0, epoch=0, columns=["caption"])
    assert sorted(out) == ["caption", "image"]
    expected = _tokenizer_for_test()([r.caption for r in records]).numpy()
    assert (out["caption"] == expected).all()


def _tokenizer_for_test():
    register_small_models()
    return open_clip.get_tokenizer("csclip-tiny")


def test_undecodable_image_is_dropped_from_the_batch():
    world = WorldConfig(image_size=32)
    records = [world_record(world, "train", i) for i in range(3)]
    table = records_to_table(records)
    rows = table.to_pylist()
    rows[1]["image_bytes"] = b"not a png"
    spec = spec_of(create_bundle("csclip-tiny", image_size=32).model, "csclip-tiny")
    out = prepare_batch(type(table).from_pylist(rows, schema=table.schema),
                        sampling=SamplingConfig().model_dump(),
                        preprocess=preprocess_key(spec.preprocess_cfg), model_name="csclip-tiny",
                        seed=0, epoch=0)
    assert out["image"].shape[0] == 2 and out["caption"].shape[0] == 2


def test_clip_method_matches_open_clip_loss():
    torch.manual_seed(0)
    model = create_bundle("csclip-tiny", image_size=32).model
    batch = _batch()
    parts = compute_loss(model, batch, objective_for(LossConfig(method="clip"), 2))
    image, text, scale = model(batch["image"], batch["caption"])[:3]
    expected = open_clip.ClipLoss()(image, text, scale)
    assert parts.total.item() == pytest.approx(expected.item(), abs=1e-6)


def test_csclip_adds_weighted_unit_loss():
    torch.manual_seed(0)
    model = create_bundle("csclip-tiny", image_size=32).model
    parts = compute_loss(model, _batch(), objective_for(LossConfig(method="csclip", unit_loss_weight=0.5), 2))
    assert parts.unit.item() > 0
    assert parts.total.item() == pytest.approx(parts.full.item() + 0.5 * parts.unit.item(), abs=1e-5)


def test_run_name_is_a_hash_of_what_is_trained(tmp_path):
    a = tiny_config(tmp_path, "sqlite:///x.db")
    moved = tiny_config(tmp_path / "elsewhere", "sqlite:///y.db", "run.num_to_keep=5")
    other = tiny_config(tmp_path, "sqlite:///x.db", "optim.lr=2e-4")
    assert run_name(a) == run_name(moved) != run_name(other)
    assert run_name(a).startswith("csclip-")


def test_undecodable_images_are_counted_and_every_epoch_is_whole_batches(tmp_path):
    # A units table is written once as shards (csclip.train.source_shards): an image that
    # does not decode is a counted rejection, named in rejects.parquet, never trained on.
    table = records_to_table([world_record(TINY_WORLD, "train", i) for i in range(10)])
    rows = table.to_pylist()
    rows[3]["image_bytes"] = b"\x89PNG broken"
    units = tmp_path / "out" / "units.parquet"
    units.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), units)
    data = DataConfig(units_uri=str(units), batch_size=4)
    spec = spec_of(create_bundle("csclip-tiny", image_size=32).model, "csclip-tiny")
    written = source_shards(data, seed=0, preprocess_cfg=spec.preprocess_cfg,
                            model_name="csclip-tiny")
    assert written.rejected == {"undecodable_image": 1}
    rejects = pq.read_table(f"{written.uri}/shards/{REJECTS_FILE}").to_pylist()
    assert [r["sample_id"] for r in rejects] == [rows[3]["sample_id"]]
    num_rows = sum(shard.rows for shard in plan_shards(written.data(data)))
    plan = plan_steps(num_rows, 0, data, num_workers=1, epochs=2, max_steps=None)
    assert (plan.num_rows, plan.total_steps) == (9, 4)  # 2 epochs x (9 rows // 4)
    # Every epoch is whole batches on each worker: 2 steps an epoch, so 5 steps take 3.
    by_steps = plan_steps(num_rows, 0, data, num_workers=1, epochs=1, max_steps=5)
    assert (by_steps.steps_per_epoch, by_steps.num_epochs, by_steps.total_steps) == (2, 3, 5)
    with pytest.raises(DataError, match="batch_size"):
        plan_steps(num_rows, 0, DataConfig(batch_size=64), num_workers=1, epochs=1,
                   max_steps=None)


# ---------------------------------------------------------------------------------------
# With Ray
# ---------------------------------------------------------------------------------------

def test_workers_taking_every_cpu_are_warned_of(ray_session, caplog):
    # The session's Ray has 4 CPUs; Ray Data's tasks need one beside the workers.
    caplog.set_level("WARNING", logger="csclip.train.loop")
    check_data_cpus(RunSection(num_workers=2, cpus_per_worker=1.5))
    assert caplog.records == []
    check_data_cpus(RunSection(num_workers=2, cpus_per_worker=2))
    [warning] = caplog.records
    assert "take 4 of this Ray instance's 4 CPUs" in warning.getMessage()
    assert "Lower run.cpus_per_worker or run.num_workers" in warning.getMessage()


def _loads_with_plain_open_clip(checkpoint_uri: str) -> None:
    register_small_models()
    model, _, _ = open_clip.create_model_and_transforms(
        "csclip-tiny", pretrained=f"{checkpoint_uri}/{WEIGHTS_FILE}", force_image_size=32)
    assert model.visual.image_size == (32, 32)


@pytest.mark.slow
def test_killed_run_resumes_with_the_losses_of_an_uninterrupted_run(ray_session, tmp_path,
                                                                     mlflow_uri):
    from mlflow.tracking import MlflowClient

    from csclip.tracking import run_metrics

    # 24 rows in batches of 8 through a local shuffle buffer of 16 rows: 3 steps an epoch,
    # checkpoints at steps 2 and 4. The worker's process is SIGKILLed after step 5, in the
    # middle of the second epoch. Ray Train registers a reported checkpoint when its
    # controller takes the report from the worker, and takes one report at a time: step 4's
    # report waited for step 2's to be taken, but may itself die with the worker. So the
    # rerun resumes from step 4 (one batch into the second epoch's shuffled stream) or
    # from step 2 (two batches into the first's), and trains the steps after it again.
    resumable = ("data.world.num_train=24", "optim.max_steps=6")
    coordinators = len(harness.split_coordinators())
    reference = run(tiny_config(tmp_path, mlflow_uri, *resumable, "run.name=uninterrupted"))
    # One worker iterates each epoch whole: no SplitCoordinator actor per epoch (Ray Train
    # keeps each alive until the run ends).
    assert len(harness.split_coordinators()) == coordinators
    expected = run_metrics(mlflow_uri, reference.mlflow_run_id, "loss")
    assert [step for step, _ in expected] == [1, 2, 3, 4, 5, 6]
    killed, losses = tiny_config(tmp_path, mlflow_uri, *resumable), tmp_path / "losses"
    with pytest.raises(Exception, match="health check failed"):  # the worker is gone
        run(killed, hooks=WorkerHooks(fail_after_step=5, fail_by="sigkill", loss_log=str(losses)))
    [[before]] = read_loss_log(losses).values()
    assert before == expected[:5]
    assert finished_result(killed) is None
    # The same command again, with how-to-run fields changed: the same run resumes.
    config = tiny_config(tmp_path, mlflow_uri, *resumable, "run.num_to_keep=3",
                         "run.checkpoint_every=3")
    result = run(config, hooks=WorkerHooks(loss_log=str(losses)))
    assert result.run_name == run_name(killed)
    resumed = result.metrics["resumed_from"]
    assert result.metrics["step"] == 6 and resumed in (2, 4)
    # The killed process logged steps 1-5, the new one the steps after its checkpoint: each
    # the uninterrupted run's loss, to the last bit.
    assert read_loss_log(losses) == {0: [expected[:5], expected[resumed:]]}
    # One MLflow run across the kill, the steps trained again logged by both processes.
    assert run_metrics(mlflow_uri, result.mlflow_run_id, "loss") == sorted(
        expected + expected[resumed:5])
    assert len(run_metrics(mlflow_uri, result.mlflow_run_id, "samples_per_s")) == 11 - resumed
    logged = MlflowClient(mlflow_uri).get_run(result.mlflow_run_id).data
    assert logged.params["optim.lr"] == "0.0001" and logged.params["loss.method"] == "csclip"
    assert logged.tags["checkpoint_uri"] == result.checkpoint_uri
    _loads_with_plain_open_clip(result.checkpoint_uri)
    # A finished run is returned as it is, without training again.
    assert run(config).checkpoint_uri == result.checkpoint_uri


def test_random_generators_resume_where_the_checkpoint_left_them(tmp_path, caplog):
    # A restarted worker draws what the uninterrupted one drew next: torch's, Python's and
    # NumPy's generators are saved with the checkpoint as plain tensors.
    import random

    import numpy as np

    from csclip.model import TRAIN_STATE_FILE, save_checkpoint
    from csclip.train import rng as generators
    from csclip.train.loop import _restore_generators, _State

    def draws() -> list:
        return [torch.rand(3).tolist(), torch.randn(2).tolist(), random.random(),
                random.gauss(0, 1), np.random.rand(2).tolist(), np.random.randn()]

    cpu = torch.device("cpu")
    generators.seed_all(7)
    draws()  # mid-stream, with the Gaussian spares of Python and NumPy held
    tiny = create_bundle("csclip-tiny", image_size=32).model
    save_checkpoint(tiny, spec_of(tiny, "csclip-tiny"), tmp_path, {
        "step": 4, "rng": generators.gather(generators.capture(cpu), world_size=1)})
    expected = draws()
    saved = torch.load(tmp_path / TRAIN_STATE_FILE, map_location="cpu", weights_only=True)
    generators.seed_all(43)  # a new process: seeded by run.seed, then restored
    _restore_generators(_State(step=4, restored_from=4, rng=saved["rng"]), 0, 1, cpu)
    assert draws() == expected
    # Saved by two workers, resumed by one: the seeded generators, and a warning.
    generators.seed_all(43)
    seeded = draws()
    generators.seed_all(43)
    _restore_generators(_State(step=4, restored_from=4, rng=saved["rng"] * 2), 0, 1, cpu)
    assert draws() == seeded
    assert "generator states of 2 workers, not 1" in caplog.text


def test_a_restart_restores_its_own_checkpoint_before_run_resume_from(monkeypatch, tmp_path):
    # The restore itself (weights, optimizer, step, the batches skipped) is the killed
    # run's above; what run.resume_from adds is where the directory comes from.
    import ray.train

    from csclip.train.loop import _checkpoint_dir

    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    run_section = tiny_config(tmp_path, "sqlite://", f"run.resume_from={other}").run
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    with _checkpoint_dir(run_section) as directory:
        assert directory == str(other)  # a fresh attempt starts from run.resume_from
    with _checkpoint_dir(tiny_config(tmp_path, "sqlite://").run) as directory:
        assert directory is None
    monkeypatch.setattr(ray.train, "get_checkpoint",
                        lambda: ray.train.Checkpoint.from_directory(str(mine)))
    with _checkpoint_dir(run_section) as directory:
        assert directory == str(mine)  # a restart: the run's own last checkpoint


def test_reused_run_name_with_other_config_is_refused(tmp_path, mlflow_uri):
    import json

    from csclip.storage import write_manifest
    from csclip.train.finished import final_uri
    from csclip.train.loop import storage_root

    config = tiny_config(tmp_path, mlflow_uri, "run.name=fixed")
    final = tmp_path / "runs" / "fixed" / "final"
    assert final_uri(storage_root(config), "fixed") == str(final)
    final.mkdir(parents=True)
    (final / "config.json").write_text(json.dumps(config.model_dump(mode="json")))
    (final / "metrics.json").write_text(json.dumps({"step": 4}))
    assert finished_result(config) is None  # no manifest: an export that did not finish
    write_manifest(final)
    assert finished_result(config).metrics == {"step": 4}
    with pytest.raises(CsclipError, match="different config"):
        finished_result(tiny_config(tmp_path, mlflow_uri, "run.name=fixed", "optim.lr=1e-3"))


def test_unfinished_run_storage_is_not_reused_for_another_config(tmp_path, mlflow_uri):
    import json

    from csclip.train.loop import check_unfinished_run

    config = tiny_config(tmp_path, mlflow_uri, "run.name=fixed")
    check_unfinished_run(config)  # nothing there yet
    saved = config.model_dump(mode="json")
    saved["run"]["fail_after_step"] = None  # written before test hooks left RunSection
    checkpoint = tmp_path / "runs" / "fixed" / "checkpoint_2026-01-01_00-00-00.000000"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps(saved))
    check_unfinished_run(config)  # the same config resumes
    # How to run it is not what it trains: these resume the same run too.
    check_unfinished_run(tiny_config(tmp_path, mlflow_uri, "run.name=fixed", "run.num_to_keep=9",
                                     "run.cpus_per_worker=2", "run.checkpoint_every=1"))
    with pytest.raises(CsclipError, match="unfinished run of a different config"):
        check_unfinished_run(tiny_config(tmp_path, mlflow_uri, "run.name=fixed", "optim.lr=1e-3"))


def test_png_roundtrip_sanity():
    # The world's PNG bytes decode with PIL (what the data pipeline relies on).
    from PIL import Image

    record = world_record(TINY_WORLD, "train", 0)
    assert Image.open(io.BytesIO(record.image_bytes)).size == (32, 32)


def test_relative_sqlite_uri_is_made_absolute(monkeypatch, tmp_path):
    # Ray workers run elsewhere: a relative sqlite path would give them their own database.
    from csclip.tracking import resolve_uri

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_uri(None) == f"sqlite:///{tmp_path}/mlflow.db"
    assert resolve_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert resolve_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_demo_stages_share_the_model_and_differ_in_objective():
    from csclip.config import load_config
    from csclip.config.demo import DemoConfig
    from csclip.demo import finetune_config, pretrain_config

    demo = load_config(DemoConfig, None, ["pretrain.optim.max_steps=7", "train.optim.max_steps=5"])
    pre = pretrain_config(demo)
    # Overriding one pretraining field keeps the others (lr stays the demo's, not 5e-6).
    assert (pre.loss.method, pre.optim.max_steps, pre.optim.lr) == ("clip", 7, 1e-3)
    assert pre.data.world.seed != demo.train.data.world.seed and pre.model.pretrained is None
    runs = [finetune_config(demo, method, "/ckpt/final") for method in ("csclip", "clip")]
    assert [r.loss.method for r in runs] == ["csclip", "clip"]
    assert all(r.model.pretrained == "/ckpt/final" and r.optim.max_steps == 5 for r in runs)
    assert run_name(runs[0]) != run_name(runs[1])
    # Fine-tuning settings do not invalidate the cached pretraining.
    tuned = load_config(DemoConfig, None, ["pretrain.optim.max_steps=7", "train.loss.unit_loss_weight=2",
                                           "train.optim.lr=0.1"])
    assert run_name(pretrain_config(tuned)) == run_name(pre)


def test_publish_copies_the_demo_sections_and_keeps_the_other_sections(tmp_path):
    from csclip.config.demo import DemoConfig
    from csclip.demo import (
        RESULTS_SECTION,
        STAGES_SECTION,
        StageTime,
        publish,
        results_section,
        stages_section,
    )
    from csclip.train import TrainResult

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "results.md").write_text(
        "# Results\n\n<!-- BEGIN ablation -->\nablation table\n<!-- END ablation -->\n")
    out = tmp_path / "runs" / "demo"
    with pytest.raises(DataError, match="run the demo first"):
        publish(str(out), root=tmp_path)
    out.mkdir(parents=True)
    from csclip.eval.report import EVALUATION_COMPLETE

    (out / EVALUATION_COMPLETE).write_text('{"files": {}}')  # the demo's evaluation finished
    fake = TrainResult("csclip-0123", str(tmp_path / "runs" / "train" / "csclip-0123" / "final"))
    (out / STAGES_SECTION).write_text(stages_section([StageTime("pretrain", 9.0)], 9.0, "make demo"))
    for table in ("| first |", "| second |"):
        (out / RESULTS_SECTION).write_text(
            results_section(DemoConfig(), fake, {"CS-CLIP": fake}, table, "make demo", 60.0))
        publish(str(out), root=tmp_path)
    text = (docs / "results.md").read_text()
    assert "ablation table" in text and "| second |" in text and "| first |" not in text
    assert "`make demo`" in text and "every stage run" in text and "`csclip-0123`" in text
    assert str(tmp_path) not in text  # runs are named, not located on this machine
    # What to match a rerun against: the versions and the CPU kernels of this run.
    assert (f"- computed with torch {torch.__version__}, Python {platform.python_version()}, "
            f"{torch.backends.cpu.get_cpu_capability()} CPU kernels") in text
    assert "| pretrain | 9 |" in (docs / "performance.md").read_text()
    reused = results_section(DemoConfig(), fake, {"CS-CLIP": fake}, "| third |", "make demo",
                             60.0, reused=["pretrain"])
    assert "pretrain reused from an earlier run" in reused
