"""Trainer options: gradient checkpointing, exact gradient accumulation, tower
locking, augmentation, resume from a checkpoint path, and the speed options (compile, fused
AdamW, channels-last, pure bf16, no host syncs between log steps, Ray Data prefetch and
pinning, SDPA attention), each checked on the CPU for being applied."""

from __future__ import annotations

import functools
import inspect
import math
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import compute_loss

from csclip.config import load_config
from csclip.config.loss import LossConfig
from csclip.config.model import ModelConfig
from csclip.config.train import DataConfig, OptimConfig, SamplingConfig, TrainConfig
from csclip.config.world import WorldConfig
from csclip.errors import CheckpointMismatch, ConfigError
from csclip.loss import LossParts, objective_for
from csclip.model import apply_training_options, create_bundle, save_checkpoint, spec_of, unwrap
from csclip.train.loop import (
    _publish,
    _Window,
    batch_options,
    check_resume_from,
    prepare_training,
    run_name,
    step_options,
)
from csclip.train.optim import build_optimizer
from csclip.train.step import (
    StepMetrics,
    StepOptions,
    build_training,
    train_step,
)
from csclip.train.stream import prepare_batch, preprocess_key
from csclip.units import records_to_table
from csclip.world import world_record

CPU = torch.device("cpu")
MODEL = "csclip-tiny"


@functools.lru_cache(maxsize=4)
def _preprocess() -> tuple:
    return preprocess_key(spec_of(create_bundle(MODEL, image_size=32).model, MODEL).preprocess_cfg)


def _batch(size: int = 8, mask_off: tuple[int, ...] = (1, 6), augment: bool = False,
           epoch: int = 0) -> dict[str, torch.Tensor]:
    """A csclip batch of world samples; rows in `mask_off` have no units (unit_mask False)."""
    records = [world_record(WorldConfig(image_size=32), "train", i) for i in range(size)]
    columns = prepare_batch(records_to_table(records), sampling=SamplingConfig().model_dump(),
                            preprocess=_preprocess(), model_name=MODEL, seed=0, epoch=epoch,
                            augment=augment)
    batch = {k: torch.as_tensor(v) for k, v in columns.items()}
    for row in mask_off:
        if row < size:
            batch["unit_mask"][row] = False
    return batch


def _model(seed: int = 0, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = create_bundle(MODEL, image_size=32).model
    apply_training_options(model, ModelConfig(name=MODEL, image_size=32, **options))
    model.train()
    return model


def _options(method: str = "csclip", **fields) -> StepOptions:
    fields.setdefault("grad_clip", None)
    return StepOptions(objective=objective_for(LossConfig(method=method), 2), **fields)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _config(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"model.name={MODEL}", "model.image_size=32",
                                           "data.batch_size=8", *overrides])


# ---------------------------------------------------------------------------------------
# Gradient checkpointing
# ---------------------------------------------------------------------------------------

def test_grad_checkpointing_gives_the_same_loss_and_gradients():
    batch, objective = _batch(), objective_for(LossConfig(method="csclip"), 2)
    plain, checkpointed = _model(), _model(grad_checkpointing=True)
    forwards = []
    block = checkpointed.visual.transformer.resblocks[0]
    block_forward = block.forward

    def counted_forward(*args, **kwargs):  # (forward hooks do not fire on recomputation)
        forwards.append(1)
        return block_forward(*args, **kwargs)

    block.forward = counted_forward
    losses = []
    for model in (plain, checkpointed):
        parts = compute_loss(model, batch, objective)
        parts.total.backward()
        losses.append(parts.total.item())
    assert len(forwards) == 2  # the block ran again in the backward: checkpointing is on
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    expected, got = _grads(plain), _grads(checkpointed)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------
# Gradient accumulation
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "accum_freq"), [("clip", 2), ("csclip", 2), ("csclip", 4)])
def test_accumulation_gives_the_unsplit_loss_and_gradients(method, accum_freq):
    batch = _batch()  # rows 1 and 6 have no units: the mask is split across micro-batches
    results = []
    for freq in (1, accum_freq):
        training = build_training(_model(), OptimConfig(), _options(method, accum_freq=freq), CPU)
        parts = train_step(training, batch)
        results.append((parts, _grads(training.model)))
    (whole, whole_grads), (split, split_grads) = results
    for name in ("total", "full", "unit"):
        assert getattr(split, name).item() == pytest.approx(getattr(whole, name).item(), abs=1e-6)
    assert whole_grads.keys() == split_grads.keys()
    for name in whole_grads:
        # Looser than 1e-6 absolute: the micro-batches' contributions are summed in
        # another order than one backward sums them; gradients reach ~3 here (token
        # embeddings), and fp32 rounding differs by up to ~2e-6 of each tensor's largest
        # entry at accum_freq=4 (measured). The temperature counted k times (open_clip's
        # way) would miss by a factor of k.
        difference = (split_grads[name] - whole_grads[name]).abs().max().item()
        assert difference <= 1e-5 * whole_grads[name].abs().max().item() + 1e-7, name
    # The temperature's gradient is counted once (open_clip's accum_freq counts it k times).
    assert whole_grads["logit_scale"].abs().item() > 1e-4


def test_batch_must_split_into_equal_micro_batches():
    with pytest.raises(ConfigError, match="accum_freq"):
        _config("optim.accum_freq=3")
    assert _config("optim.accum_freq=4").optim.accum_freq == 4


# ---------------------------------------------------------------------------------------
# Locking towers
# ---------------------------------------------------------------------------------------

def test_locked_towers_get_no_gradient_and_no_optimizer_slot():
    model = _model(lock={"image": True, "image_unlocked_groups": 1,
                         "text": True, "text_unlocked_layers": 2})
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    # Image: only the last group (the projection). Text: the last block + ln_final, and
    # the projection. The temperature is in neither tower.
    assert {n for n in trainable if n.startswith("visual.")} == {"visual.proj"}
    assert "text_projection" in trainable and "ln_final.weight" in trainable
    assert any(n.startswith("transformer.resblocks.1.") for n in trainable)
    assert not any(n.startswith(("transformer.resblocks.0.", "token_embedding")) for n in trainable)
    assert "logit_scale" in trainable
    optimizer = build_optimizer(model, OptimConfig())
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters() if p.requires_grad}

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    training = build_training(model, OptimConfig(lr=1e-3), _options(), CPU)
    train_step(training, _batch())
    for name, param in model.named_parameters():
        changed = not torch.equal(param, before[name])
        if name in trainable:
            assert changed, f"{name} is unlocked but did not train"
        else:
            assert param.grad is None and not changed, f"{name} is locked but moved"


def test_unlocked_groups_need_the_lock_and_must_exist():
    with pytest.raises(ConfigError, match="model.lock.image=true"):
        _config("model.lock.image_unlocked_groups=1")
    with pytest.raises(ConfigError, match="model.lock.text=true"):
        _config("model.lock.text_unlocked_layers=1")
    with pytest.raises(ConfigError, match="has 4 groups"):  # 2 blocks + embeddings + proj
        _model(lock={"image": True, "image_unlocked_groups": 5})
    # The fields before the lock section: one line naming where they went.
    with pytest.raises(ConfigError, match=r"model.lock_image is no longer a field: set model\.lock\.image"):
        _config("model.lock_image=true")


# ---------------------------------------------------------------------------------------
# Augmentation
# ---------------------------------------------------------------------------------------

def test_augmentation_is_off_by_default_and_changes_images_when_on():
    assert DataConfig().augment is False
    assert "augment" in inspect.signature(prepare_batch).parameters
    plain = _batch(size=3)
    assert torch.equal(_batch(size=3, augment=False)["image"], plain["image"])
    augmented = _batch(size=3, augment=True)
    assert augmented["image"].shape == plain["image"].shape
    assert not torch.allclose(augmented["image"], plain["image"], atol=1e-3)
    # Seeded per (seed, sample, epoch): the same epoch repeats, the next one differs.
    assert torch.equal(_batch(size=3, augment=True)["image"], augmented["image"])
    assert not torch.equal(_batch(size=3, augment=True, epoch=1)["image"], augmented["image"])
    # The text columns are untouched.
    assert torch.equal(augmented["caption"], plain["caption"])


# ---------------------------------------------------------------------------------------
# Resume from an explicit checkpoint; optimizer state on the parameters' device
# ---------------------------------------------------------------------------------------

def _trained_checkpoint(tmp_path: Path, config: TrainConfig) -> tuple[Path, torch.nn.Module, dict]:
    setup = prepare_training(config, CPU)
    training, spec = setup.training, setup.spec
    train_step(training, _batch())
    directory = tmp_path / "checkpoint_000001"
    train_state = {"optimizer": training.optimizer.state_dict(),
                   "scaler": training.scaler.state_dict(), "step": 7, "samples": 56}
    save_checkpoint(training.model, spec, directory, train_state)
    return directory, training.model, training.optimizer.state_dict()


def test_resume_from_restores_model_optimizer_scaler_and_step(tmp_path):
    config = _config()
    directory, trained, optimizer_state = _trained_checkpoint(tmp_path, config)
    resumed = _config(f"run.resume_from={directory}")
    check_resume_from(resumed, spec_of(trained, MODEL))  # a valid checkpoint passes
    setup = prepare_training(resumed, CPU, resumed.run.resume_from)
    training, state = setup.training, setup.state
    assert (state.step, state.samples, state.restored_from) == (7, 56, 7)
    for (name, param), expected in zip(training.model.named_parameters(), trained.parameters(),
                                       strict=True):
        assert torch.equal(param, expected), name
    restored = training.optimizer.state_dict()["state"]
    assert restored.keys() == optimizer_state["state"].keys()
    for index, slots in optimizer_state["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(restored[index][key], slots[key])
    assert training.scaler.state_dict() == {}  # fp32 on CPU: the scaler is off, as saved


def test_resume_from_is_checked_before_training(tmp_path):
    config = _config()
    spec = spec_of(create_bundle(MODEL, image_size=32).model, MODEL)
    with pytest.raises(ConfigError, match="not a directory"):
        check_resume_from(_config(f"run.resume_from={tmp_path / 'missing'}"), spec)
    with pytest.raises(CheckpointMismatch, match="not a csclip checkpoint"):
        check_resume_from(_config(f"run.resume_from={tmp_path}"), spec)
    weights_only = save_checkpoint(create_bundle(MODEL, image_size=32).model, spec, tmp_path / "final")
    with pytest.raises(CheckpointMismatch, match="train_state.pt"):
        check_resume_from(_config(f"run.resume_from={weights_only}"), spec)
    with pytest.raises(ConfigError, match="local checkpoint directory"):
        _config("run.resume_from=s3://bucket/run/checkpoint_000001")
    relative = TrainConfig.model_validate({"run": {"resume_from": "runs/x"}}).run.resume_from
    assert Path(relative).is_absolute()
    assert run_name(config) != run_name(_config(f"run.resume_from={tmp_path}"))


def test_worker_restores_its_own_checkpoint_before_resume_from(tmp_path, monkeypatch):
    import ray.train

    from csclip.train.loop import _checkpoint_dir

    own = tmp_path / "own"
    own.mkdir()
    (own / "marker").write_text("own")
    config = _config(f"run.resume_from={tmp_path / 'other'}")
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    with _checkpoint_dir(config.run) as directory:
        assert directory == str(tmp_path / "other")  # a fresh run starts from resume_from
    monkeypatch.setattr(ray.train, "get_checkpoint",
                        lambda: ray.train.Checkpoint.from_directory(str(own)))
    with _checkpoint_dir(config.run) as directory:  # a restarted run resumes its own
        assert (Path(directory) / "marker").read_text() == "own"
    with _checkpoint_dir(_config().run) as directory:
        assert (Path(directory) / "marker").read_text() == "own"


def test_optimizer_state_is_restored_onto_the_parameters_device(tmp_path):
    # The meta device stands in for a GPU: if AdamW were built, or its state loaded, before
    # the model moved, the state would stay on the CPU while the parameters left.
    directory, _, _ = _trained_checkpoint(tmp_path, _config())
    meta = torch.device("meta")
    setup = prepare_training(_config(), meta, str(directory))
    training = setup.training
    assert setup.state.step == 7
    for param in training.model.parameters():
        assert param.device.type == "meta"
        for value in training.optimizer.state[param].values():
            if value.dim() > 0:  # the step count may stay a CPU scalar
                assert value.device.type == "meta"


# ---------------------------------------------------------------------------------------
# Speed options
# ---------------------------------------------------------------------------------------

def test_compile_wraps_the_runner_and_keeps_the_model_plain():
    training = build_training(_model(), OptimConfig(), _options(compile=True), CPU)
    assert isinstance(training.runner, torch._dynamo.eval_frame.OptimizedModule)
    assert not isinstance(training.model, torch._dynamo.eval_frame.OptimizedModule)
    assert unwrap(training.runner) is training.model
    assert step_options(_config("run.compile=true")).compile is True


def test_fused_adamw_on_cpu_and_cuda_parameters():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu_optimizer = build_optimizer(torch.nn.Linear(4, 4), OptimConfig())
    assert cpu_optimizer.defaults["fused"] is True
    cpu_optimizer.step()  # never crashes on the CPU
    assert not build_optimizer(torch.nn.Linear(4, 4), OptimConfig(fused=False)).defaults["fused"]
    with FakeTensorMode():  # fake CUDA tensors: no GPU needed to see the flag
        cuda_model = torch.nn.Linear(4, 4, device="cuda")
        assert build_optimizer(cuda_model, OptimConfig()).defaults["fused"] is True
        assert not build_optimizer(cuda_model, OptimConfig(fused=False)).defaults["fused"]


def test_channels_last_gives_the_same_loss():
    batch = _batch()
    losses = []
    for channels_last in (False, True):
        training = build_training(_model(), OptimConfig(), _options(channels_last=channels_last), CPU)
        if channels_last:
            assert unwrap(training.runner).visual.conv1.weight.is_contiguous(memory_format=torch.channels_last)
        losses.append(train_step(training, batch).total.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_pure_bf16_runs_in_bf16_and_steps_fp32_master_weights():
    training = build_training(_model(), OptimConfig(lr=1e-6, warmup_steps=0),
                              _options(precision="bf16_pure"), CPU)
    assert unwrap(training.runner).visual.conv1.weight.dtype == torch.bfloat16
    assert training.model.visual.conv1.weight.dtype == torch.float32
    before = training.model.visual.proj.detach().clone()
    parts = train_step(training, _batch())
    assert parts.total.dtype == torch.float32 and torch.isfinite(parts.total)  # fp32 loss
    after = training.model.visual.proj.detach()
    # lr 1e-6 moves each weight by ~1e-6, far below bf16's spacing (~2e-4 near 0.05):
    # stepped in bf16 almost every weight would stay put; the fp32 master weights move.
    assert (after != before).float().mean() > 0.9
    assert (after.to(torch.bfloat16) != before.to(torch.bfloat16)).float().mean() < 0.1
    assert torch.equal(unwrap(training.runner).visual.proj, after.to(torch.bfloat16))
    assert all(p.grad is None for p in training.runner.parameters())


class _SyncCounter:
    """Counts tensor-to-host reads (.item(), .tolist(), bool(), float(), int(), .numpy())
    called from csclip.train.step or csclip.train."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy")
    FILES = ("csclip/train/step.py", "csclip/train/loop.py")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name), name))

    def _wrap(self, original, name):
        def counted(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
            if caller.endswith(self.FILES):
                self.calls.append(f"{name} in {caller}")
            return original(tensor, *args, **kwargs)

        return counted


@pytest.mark.parametrize("method", ["clip", "csclip"])
def test_no_host_sync_between_log_steps(monkeypatch, method):
    training = build_training(_model(), OptimConfig(), _options(method, grad_clip=1.0), CPU)
    batch, metrics = _batch(), StepMetrics()
    counter = _SyncCounter(monkeypatch)
    for step in range(1, 4):
        parts = train_step(training, batch)
        metrics.add(step, parts, training.model.logit_scale, lr=1e-5)
    assert counter.calls == []
    rows = metrics.take()
    assert len(counter.calls) == 1  # one transfer for the three steps
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(isinstance(row["loss"], float) for row in rows) and len(metrics) == 0


def test_publish_logs_every_buffered_step_with_the_window_rate():
    metrics, logged = StepMetrics(), []
    zero = LossParts(torch.tensor(1.0), torch.tensor(0.5), torch.tensor(1.5))
    for step in (1, 2, 3):
        metrics.add(step, zero, torch.tensor(0.0), lr=0.1)

    class Logger:
        def log(self, step, row):
            logged.append((step, dict(row)))

    window = _Window(start=0.0, samples=24)
    last = _publish(metrics, window, Logger(), steps_per_epoch=2)
    assert [step for step, _ in logged] == [1, 2, 3]
    assert last["step"] == 3 and last["epoch"] == 1.5 and last["samples_per_s"] > 0
    assert "samples_per_s" not in logged[0][1]
    assert window.samples == 0


def test_ray_batches_are_prefetched_and_pinned_only_for_cuda():
    from ray.data.iterator import DataIterator

    data = DataConfig(prefetch_batches=3)
    on_cpu = batch_options(data, CPU, seed=1)
    on_gpu = batch_options(data, torch.device("cuda", 0), seed=1)
    assert on_cpu["prefetch_batches"] == on_gpu["prefetch_batches"] == 3
    assert on_cpu["pin_memory"] is False and on_gpu["pin_memory"] is True
    assert batch_options(DataConfig(pin_memory=False), torch.device("cuda", 0), 1)["pin_memory"] is False
    # The installed Ray accepts every option by these names.
    inspect.signature(DataIterator.iter_torch_batches).bind(None, **on_gpu)


def test_attention_runs_through_sdpa():
    from torch.profiler import ProfilerActivity, profile

    model, batch = _model(), _batch(size=2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(batch["image"], batch["caption"])
    calls = {e.key: e.count for e in prof.key_averages()}
    # nn.MultiheadAttention with need_weights=False (open_clip) dispatches to SDPA:
    # two vision and two text blocks.
    assert calls.get("aten::scaled_dot_product_attention", 0) == 4


def test_how_to_run_fields_keep_the_run_name():
    base = _config()
    for override in ("run.compile=true", "optim.accum_freq=2", "model.grad_checkpointing=true",
                     "run.channels_last=true", "data.prefetch_batches=4", "optim.fused=false",
                     "run.num_to_keep=5", "run.cpus_per_worker=2", "run.checkpoint_every=7"):
        assert run_name(_config(override)) == run_name(base), override
    for override in ("data.augment=true", "model.lock.text=true", "run.precision=bf16_pure"):
        assert run_name(_config(override)) != run_name(base), override


@pytest.mark.parametrize(("ceiling", "expected"), [(100.0, math.log(100)), (None, math.log(500)),
                                                   (50.0, math.log(50))])
def test_the_temperature_ceiling_is_the_configs(ceiling, expected):
    # open_clip_train clamps logit_scale at ln 100 after every step; the authors never do
    # (configs/paper.yaml: optim.logit_scale_max null).
    model = _model()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(500))
    training = build_training(model, OptimConfig(lr=1e-12), _options(logit_scale_max=ceiling),
                              CPU)
    train_step(training, _batch())
    assert model.logit_scale.item() == pytest.approx(expected, abs=1e-6)
