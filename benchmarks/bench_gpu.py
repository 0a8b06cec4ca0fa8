"""GPU training speed: csclip's step against open_clip_train's loop, with FLOPs and MFU.

    python benchmarks/bench_gpu.py --out bench_gpu_out                    # one GPU, < 5 min
    python benchmarks/bench_gpu.py --device cpu --out /tmp/bench_gpu     # CPU smoke run

In one process, on one model config (ViT-B-32 QuickGELU at 224 px, random weights, on a
GPU; csclip-tiny at 32 px on the CPU), the same prepared batches and the same seed:
  open_clip_train   open_clip_train.train.train_one_epoch with open_clip.ClipLoss (bf16
                    autocast on GPU), eager and with its --torchcompile (torch.compile);
  csclip <method>   csclip.train.step.train_step for clip, negclip and csclip (N = 2), with the
                    trainer's defaults (eager: fused AdamW on CUDA, bf16 autocast, metrics
                    read every 10 steps) and with run.compile (compiled);
at every --batches size. Columns: samples/s, step ms (wall, GPU synchronised), host ms
(time to issue a step: close to step ms means the GPU waits for Python), model TFLOP/s and
MFU (FLOPs of one eager step from torch.utils.flop_counter.FlopCounterMode: forward,
backward and loss matmuls; the optimizer's elementwise work is not counted), peak GiB
(torch.cuda.max_memory_allocated). Then a torch.profiler summary of one eager csclip
step: top ops by self device time (self CPU time on a CPU) and the kernels' share of wall time.

Texts are real: SugarCrepe's COCO captions (shared/data/sugarcrepe) with units from the
rules backend and slots from csclip's sampler; the synthetic world's captions and gold
units when that data is absent. Images are world scenes through the model's eval
transform. Batches sit on the device before timing, as Ray Data's prefetch leaves them.
Rows run in order until --budget-s is spent; later rows are listed as skipped.
Writes bench_gpu.md, bench_gpu.csv and profile.txt to --out. Imports no Ray: csclip's pure
modules (model, loss, sampling, step, optim, data.prepare_batch, extract rules, world).

    python benchmarks/bench_gpu.py --estimate-memory --out mem_out    # no GPU needed

estimates instead the peak memory of one csclip training step per GPU for ViT-B-32 at
224 px (or --model) in several configurations (batch, method, optim.accum_freq,
model.grad_checkpointing, run.precision), by running the step on fake tensors
(FakeTensorMode: shapes, no data, no compute) and counting the bytes of live storages.
It uses CPU bf16 autocast, whose casts match CUDA's for this model, and a stand-in loss
of the same feature shapes (the real L_unit indexes by the unit mask, which fake tensors
cannot); the loss's own memory is a few MB. Writes memory.md.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: csclip and benchmarks import from the repo
    sys.path.insert(0, str(ROOT))

# bf16 dense tensor-core peaks (TFLOP/s) by device name; --peak-tflops for anything else.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0}
OPTIM_LR = 1e-5
LOG_EVERY = 10  # the trainer's default run.log_every: metrics reach the host this often


@dataclasses.dataclass
class Row:
    loop: str            # "open_clip_train" or "csclip"
    method: str          # clip | negclip | csclip
    variant: str         # eager | compiled
    batch: int
    samples_per_s: float | None = None
    step_ms: float | None = None
    host_ms: float | None = None
    flops_per_step: float | None = None
    peak_gib: float | None = None
    note: str = ""

    @property
    def name(self) -> str:
        if self.loop == "open_clip_train":
            return "open_clip_train (ClipLoss)" + (" --torchcompile" if self.variant == "compiled" else "")
        return f"csclip --method {self.method}" + (" (compiled)" if self.variant == "compiled" else "")


# ---------------------------------------------------------------------------------------
# Data: real caption texts through csclip's units, sampler and tokenizer
# ---------------------------------------------------------------------------------------

def find_captions(explicit: str | None) -> Path | None:
    """The SugarCrepe directory: --captions, else shared/data/sugarcrepe beside or above
    the repository; None when absent."""
    if explicit:
        if not any(Path(explicit).glob("*.json")):
            raise SystemExit(f"--captions {explicit}: no SugarCrepe *.json files there")
        return Path(explicit)
    candidates = [ROOT / "shared" / "data" / "sugarcrepe", ROOT.parent / "shared" / "data" / "sugarcrepe"]
    return next((p for p in candidates if p.is_dir() and any(p.glob("*.json"))), None)


def caption_records(count: int, captions: Path | None) -> tuple[list, str]:
    """`count` UnitsRecords with units and a world image each, and where the texts came from."""
    from csclip.config.world import WorldConfig
    from csclip.units import UnitsRecord
    from csclip.world import world_record

    world = WorldConfig(image_size=64)
    images = [world_record(world, "train", i).image_bytes for i in range(16)]
    if captions is None:
        return [world_record(world, "train", i) for i in range(count)], "world captions, gold units"
    from csclip.config.extract import InputConfig
    from csclip.extract.backends import rules_outcome
    from csclip.extract.captions import iter_captions

    records: list[UnitsRecord] = []
    for row in iter_captions(InputConfig(format="sugarcrepe", uri=str(captions))):
        record = rules_outcome(row).record
        if record is not None:
            records.append(dataclasses.replace(record, image_bytes=images[len(records) % 16],
                                               image_path=None, split="train"))
        if len(records) == count:
            break
    # Fewer captions with units than asked: repeat them under fresh sample ids.
    while len(records) < count:
        source = records[len(records) % max(1, len(records))]
        records.append(dataclasses.replace(source, sample_id=f"{source.sample_id}-r{len(records)}"))
    return records, f"SugarCrepe COCO captions ({captions}), rules units"


def prepare_batches(records: list, sizes: list[int], pool: int, spec, model_name: str,
                    num_unit_slots: int, device: torch.device) -> dict[int, list[dict]]:
    """`pool` csclip batches per size (every column CS-CLIP needs), on `device`."""
    from csclip.config.train import SamplingConfig
    from csclip.train.stream import prepare_batch, preprocess_key
    from csclip.units import records_to_table

    sampling = SamplingConfig(num_unit_slots=num_unit_slots).model_dump(mode="json")
    out: dict[int, list[dict]] = {}
    for size in sizes:
        batches = []
        for index in range(pool):
            chunk = [records[(index * size + i) % len(records)] for i in range(size)]
            columns = prepare_batch(records_to_table(chunk), sampling=sampling,
                                    preprocess=preprocess_key(spec.preprocess_cfg),
                                    model_name=model_name, seed=0, epoch=index)
            batches.append({k: torch.as_tensor(v).to(device) for k, v in columns.items()})
        out[size] = batches
    return out


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_model(args, device: torch.device) -> torch.nn.Module:
    from csclip.model import create_bundle

    torch.manual_seed(0)
    model = create_bundle(args.model, device=str(device), quick_gelu=args.quick_gelu,
                          image_size=args.image_size).model
    model.train()
    return model


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def timed_steps(step: Callable[[int], None], warmup: int, steps: int,
                device: torch.device) -> tuple[float, float]:
    """(wall seconds per step, host seconds to issue a step) over `steps` after `warmup`."""
    for index in range(warmup):
        step(index)
    synchronize(device)
    started = time.perf_counter()
    for index in range(warmup, warmup + steps):
        step(index)
    issued = time.perf_counter()
    synchronize(device)
    finished = time.perf_counter()
    return (finished - started) / steps, (issued - started) / steps


def csclip_row(row: Row, args, batches: list[dict], device: torch.device,
               flops: dict[tuple[str, int], float]) -> None:
    """Time csclip.train.step.train_step; count FLOPs on the second eager warmup step."""
    from torch.utils.flop_counter import FlopCounterMode

    from csclip.config.loss import LossConfig
    from csclip.config.train import OptimConfig
    from csclip.loss import objective_for
    from csclip.train.step import StepMetrics, StepOptions, build_training, train_step

    options = StepOptions(objective=objective_for(LossConfig(method=row.method), args.num_unit_slots),
                          precision=args.precision, grad_clip=1.0,
                          compile=row.variant == "compiled", compile_mode=args.compile_mode)
    reset_memory(device)
    training = build_training(fresh_model(args, device), OptimConfig(lr=OPTIM_LR, warmup_steps=0),
                              options, device)
    metrics = StepMetrics()
    key = (row.method, row.batch)

    def step(index: int) -> None:
        batch = batches[index % len(batches)]
        if index == 1 and key not in flops and row.variant == "eager":
            with FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as counter:
                parts = train_step(training, batch)
            flops[key] = float(counter.get_total_flops())
        else:
            parts = train_step(training, batch)
        metrics.add(index, parts, training.model.logit_scale, OPTIM_LR)
        if (index + 1) % LOG_EVERY == 0:
            metrics.take()

    row.step_ms, row.host_ms = (1000 * s for s in timed_steps(step, args.warmup, args.steps, device))
    row.samples_per_s = row.batch / (row.step_ms / 1000)
    row.peak_gib = peak_gib(device)
    row.flops_per_step = flops.get(key)


def _cpu_attention_flops() -> dict:
    # FlopCounterMode knows the CUDA SDPA kernels; on the CPU attention runs as
    # _scaled_dot_product_flash_attention_for_cpu, which it would count as zero.
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    ops = torch.ops.aten
    mapping = {}
    if hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[ops._scaled_dot_product_flash_attention_for_cpu] = forward
        mapping[ops._scaled_dot_product_flash_attention_for_cpu_backward] = backward
    return mapping


def open_clip_row(row: Row, args, batches: list[dict], device: torch.device,
                  flops: dict[tuple[str, int], float]) -> None:
    """Time open_clip_train's train_one_epoch (its AdamW, cosine schedule, grad clipping,
    logit_scale clamp) over in-memory device batches; FLOPs as csclip's clip step."""
    import open_clip
    from open_clip_train.scheduler import cosine_lr
    from open_clip_train.train import train_one_epoch

    from benchmarks.bench_train import DataInfo, _Loader

    reset_memory(device)
    model = fresh_model(args, device)
    model.output_dict = True  # as open_clip_train creates it
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=OPTIM_LR, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    runner = torch.compile(model) if row.variant == "compiled" else model  # its --torchcompile
    # Its own bf16 autocast on a GPU whatever csclip's rows use (bf16_pure included): the
    # baseline is open_clip_train as its users run it.
    precision = "amp_bf16" if device.type == "cuda" and args.precision != "fp32" else "fp32"
    settings = SimpleNamespace(
        device=str(device), precision=precision, distill=False, accum_freq=1,
        skip_scheduler=False, grad_clip_norm=1.0, horovod=False, log_every_n_steps=10**9,
        batch_size=row.batch, world_size=1, rank=0, local_rank=0, wandb=False, save_logs=False,
        distributed=False)
    scheduler = cosine_lr(optimizer, OPTIM_LR, 0, args.warmup + args.steps)
    loss = open_clip.ClipLoss()

    def epoch(indices: range, number: int) -> None:
        data = [(batches[i % len(batches)]["image"], batches[i % len(batches)]["caption"])
                for i in indices]
        train_one_epoch(runner, {"train": DataInfo(_Loader(data, len(data) * row.batch))}, loss,
                        number, optimizer, None, scheduler, None, settings)

    epoch(range(args.warmup), 0)
    synchronize(device)
    started = time.perf_counter()
    epoch(range(args.warmup, args.warmup + args.steps), 1)
    synchronize(device)
    row.step_ms = 1000 * (time.perf_counter() - started) / args.steps
    row.samples_per_s = row.batch / (row.step_ms / 1000)
    row.peak_gib = peak_gib(device)
    row.flops_per_step = flops.get(("clip", row.batch))
    row.note = "FLOPs: csclip clip step's (the same model and ClipLoss math)"


# ---------------------------------------------------------------------------------------
# Profile
# ---------------------------------------------------------------------------------------

def profile_step(args, batches: list[dict], device: torch.device, method: str) -> tuple[str, str]:
    """(markdown summary, full op table) of `args.profile_steps` eager steps of `method`."""
    from torch.profiler import ProfilerActivity, profile

    from csclip.config.loss import LossConfig
    from csclip.config.train import OptimConfig
    from csclip.loss import objective_for
    from csclip.train.step import StepOptions, build_training, train_step

    options = StepOptions(objective=objective_for(LossConfig(method=method), args.num_unit_slots),
                          precision=args.precision, grad_clip=1.0)
    reset_memory(device)
    training = build_training(fresh_model(args, device), OptimConfig(lr=OPTIM_LR, warmup_steps=0),
                              options, device)
    for index in range(max(2, args.warmup)):
        train_step(training, batches[index % len(batches)])
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        for index in range(args.profile_steps):
            train_step(training, batches[index % len(batches)])
        synchronize(device)
    wall_ms = 1000 * (time.perf_counter() - started) / args.profile_steps
    averages = prof.key_averages()
    on_device = device.type == "cuda"
    sort_key = "self_device_time_total" if on_device else "self_cpu_time_total"
    try:
        table = averages.table(sort_by=sort_key, row_limit=30)
    except (AttributeError, KeyError):  # older torch names it after CUDA
        sort_key = "self_cuda_time_total"
        table = averages.table(sort_by=sort_key, row_limit=30)

    def self_time(event) -> float:
        if on_device:
            return float(getattr(event, "self_device_time_total", 0.0)
                         or getattr(event, "self_cuda_time_total", 0.0))
        return float(event.self_cpu_time_total)

    top = sorted(averages, key=self_time, reverse=True)[:12]
    total = sum(self_time(e) for e in averages) or 1.0
    lines = [f"Profile: {args.profile_steps} eager steps of csclip --method {method}, batch "
             f"{batches[0]['image'].shape[0]} ({'device' if on_device else 'CPU'} self time; "
             f"wall {wall_ms:.1f} ms per step under the profiler).", ""]
    if on_device:
        kernel_ms = _kernel_ms(prof) / args.profile_steps
        lines += [f"Kernels ran {kernel_ms:.1f} ms of each {wall_ms:.1f} ms step "
                  f"({100 * kernel_ms / wall_ms:.0f}% busy); the rest the GPU waited for the host.", ""]
    attention = sorted({e.key for e in averages if "attention" in e.key.lower()})
    lines += [f"Attention ops: {', '.join(attention) or 'none found'}.", "",
              "| op | calls | self ms per step | share |", "|---|---:|---:|---:|"]
    lines += [f"| `{e.key[:70]}` | {e.count // args.profile_steps} | "
              f"{self_time(e) / 1000 / args.profile_steps:.2f} | {100 * self_time(e) / total:.1f}% |"
              for e in top]
    return "\n".join(lines), table


def _kernel_ms(prof) -> float:
    # Sum of GPU kernel durations (streams rarely overlap in a training step).
    from torch.autograd import DeviceType

    return sum(e.time_range.elapsed_us() for e in prof.events()
               if e.device_type == DeviceType.CUDA) / 1000


# ---------------------------------------------------------------------------------------
# Memory estimate on fake tensors
# ---------------------------------------------------------------------------------------

class _LiveBytes(TorchDispatchMode):
    """Bytes of the storages alive now and at most, counting each storage once: those
    registered with `add` and every op's outputs (freed when their storage dies)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.weak import WeakIdKeyDictionary

        self.current = self.peak = 0
        self._seen = WeakIdKeyDictionary()

    def add(self, tensor) -> None:
        import weakref

        if not isinstance(tensor, torch.Tensor):
            return
        storage = tensor.untyped_storage()
        if storage in self._seen:
            return
        size = storage.nbytes()
        self._seen[storage] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, size)

    def _free(self, size: int) -> None:
        self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_leaves

        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            self.add(leaf)
        return out


def _fake_model(args, mode, grad_checkpointing: bool) -> torch.nn.Module:
    # Built on the meta device (no memory, no init compute), then every parameter and
    # buffer becomes a fake CPU tensor of the same shape and dtype.
    from csclip.config.model import ModelConfig
    from csclip.model import apply_training_options, create_bundle

    with torch.device("meta"):
        model = create_bundle(args.model, device="meta", quick_gelu=args.quick_gelu,
                              image_size=args.image_size).model
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                fake = mode.from_tensor(param.data)
                with mode:
                    module._parameters[name] = torch.nn.Parameter(
                        fake.to("cpu"), requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                fake = mode.from_tensor(buffer)
                with mode:
                    module._buffers[name] = fake.to("cpu")
    apply_training_options(model, ModelConfig(name=args.model, quick_gelu=args.quick_gelu,
                                              grad_checkpointing=grad_checkpointing))
    model.train()
    return model


def _placed_to(original):
    # build_training's model.to(device): the fake parameters are on the CPU already, and
    # torch swaps fake parameters even for a no-op move, which fails for a tensor with
    # itself. Every other .to (the bf16 copy's dtype) runs as usual.
    def to(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.device):
            return self
        return original(self, *args, **kwargs)

    return to


def estimate_memory(args, method: str, batch: int, *, accum_freq: int = 1,
                    grad_checkpointing: bool = False, precision: str = "bf16") -> tuple[float, float]:
    """(GiB held between steps: weights, gradients, AdamW state; peak GiB during a step)
    of csclip's training step, on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from csclip.config.loss import LossConfig
    from csclip.config.train import OptimConfig
    from csclip.loss import LossParts, Objective, clip_loss, objective_for
    from csclip.train.step import StepOptions, build_training, train_step

    class SameShapesLoss(Objective):
        def loss(self, image, texts, masks, scale, images=None):
            total = sum(clip_loss(image, feature, scale) for feature in texts.values())
            return LossParts(total, total, total)

    objective = objective_for(LossConfig(method=method), args.num_unit_slots)
    columns = objective.columns
    mode = FakeTensorMode()
    model = _fake_model(args, mode, grad_checkpointing)
    with mode:
        # trim_text off: a fake batch has no token ids to read lengths from; the estimate is
        # a batch whose every row fills the context, the most a step can hold.
        options = StepOptions(objective=SameShapesLoss(method, columns), precision=precision,
                              accum_freq=accum_freq, trim_text=False)
        with mock.patch.object(torch.nn.Module, "to", _placed_to(torch.nn.Module.to)):
            training = build_training(model, OptimConfig(), options, torch.device("cpu"))
        context = int(model.context_length)
        batch_tensors = {"image": torch.randn(batch, 3, args.image_size, args.image_size),
                         **{m: torch.ones(batch, dtype=torch.bool) for m in objective.mask_columns},
                         **{c: torch.randint(0, 49407, (batch, context)) for c in columns}}
        train_step(training, batch_tensors)  # creates AdamW's state and the gradients
        tracker = _LiveBytes()
        held = [*training.model.parameters(), *training.model.buffers(), *batch_tensors.values(),
                *(p.grad for p in training.model.parameters() if p.grad is not None),
                *(v for state in training.optimizer.state.values() for v in state.values())]
        if training.shadow is not None:
            held += [*training.runner.parameters(), *training.runner.buffers()]
        for tensor in held:
            tracker.add(tensor)
        between = tracker.current
        with tracker:
            train_step(training, batch_tensors)
    return between / 2**30, tracker.peak / 2**30


# (method, batch as a multiple of the first --batches size, accum_freq, grad_checkpointing,
# precision); bf16 is what run.precision=auto gives on a GPU. (bf16_pure is left out: its
# bf16 copy of the model is a deepcopy, which fake tensors do not support.)
MEMORY_CASES = [
    ("clip", 1, 1, False, "bf16"), ("csclip", 1, 1, False, "bf16"),
    ("csclip", 1, 2, False, "bf16"), ("csclip", 1, 4, False, "bf16"),
    ("csclip", 1, 1, True, "bf16"), ("csclip", 1, 2, True, "bf16"),
    ("clip", 2, 1, False, "bf16"), ("csclip", 2, 1, False, "bf16"),
    ("csclip", 2, 2, True, "bf16"),
]


def memory_report(args) -> str:
    lines = [f"Estimated memory per GPU, {args.model} (QuickGELU {args.quick_gelu}) at "
             f"{args.image_size} px, N = {args.num_unit_slots} "
             "(`python benchmarks/bench_gpu.py --estimate-memory`).", "",
             "| method | batch per GPU | optim.accum_freq | model.grad_checkpointing | "
             "run.precision | held between steps GiB | peak GiB |",
             "|---|---:|---:|---|---|---:|---:|"]
    for method, multiple, accum, checkpointing, precision in MEMORY_CASES:
        if method not in args.methods:
            continue
        batch = multiple * args.batches[0]
        started = time.perf_counter()
        between, peak = estimate_memory(args, method, batch, accum_freq=accum,
                                        grad_checkpointing=checkpointing, precision=precision)
        shown = "auto (bf16 autocast)" if precision == "bf16" else precision
        lines.append(f"| {method} | {batch} | {accum} | {str(checkpointing).lower()} | {shown} | "
                     f"{between:.2f} | {peak:.2f} |")
        print(lines[-1], f"({time.perf_counter() - started:.0f} s)", flush=True)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------

def detect_peak(device: torch.device, given: float | None) -> tuple[float | None, str]:
    if given is not None:
        return given, "given with --peak-tflops"
    if device.type != "cuda":
        return None, "none on the CPU (pass --peak-tflops for an MFU column)"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in name:
            return value, f"{name}: bf16 dense"
    return None, f"{name}: unknown (pass --peak-tflops)"


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def table_rows(rows: list[Row], peak: float | None) -> list[dict[str, str]]:
    baseline = {(r.variant, r.batch): r.samples_per_s for r in rows
                if r.loop == "open_clip_train" and r.samples_per_s}
    out = []
    for row in rows:
        tflops = (row.flops_per_step / (row.step_ms / 1000) / 1e12
                  if row.flops_per_step and row.step_ms else None)
        ratios = [row.samples_per_s / baseline[(variant, row.batch)]
                  if row.samples_per_s and baseline.get((variant, row.batch)) else None
                  for variant in ("eager", "compiled")]
        out.append({
            "loop": row.name, "batch": str(row.batch),
            "samples/s": _fmt(row.samples_per_s, ".4g"), "step ms": _fmt(row.step_ms, ".1f"),
            "host ms": _fmt(row.host_ms, ".1f"),
            "GFLOP/step": _fmt(row.flops_per_step and row.flops_per_step / 1e9, ".1f"),
            "model TFLOP/s": _fmt(tflops, ".3g"),
            "MFU": _fmt(tflops and peak and 100 * tflops / peak, ".1f") + ("%" if tflops and peak else ""),
            "peak GiB": _fmt(row.peak_gib, ".1f"),
            "vs open_clip_train": _fmt(ratios[0], ".2f"),
            "vs open_clip_train --torchcompile": _fmt(ratios[1], ".2f"),
            "note": row.note})
    return out


def markdown_table(records: list[dict[str, str]]) -> str:
    columns = [c for c in records[0] if c != "note"] if records else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(r[c] for c in columns) + " |" for r in records]
    notes = sorted({r["note"] for r in records if r["note"]})
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []))


def write_outputs(out: Path, header: str, records: list[dict[str, str]], profile_md: str,
                  profile_table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = f"{header}\n\n{markdown_table(records)}\n\n{profile_md}\n"
    (out / "bench_gpu.md").write_text(report)
    with (out / "bench_gpu.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]) if records else ["loop"])
        writer.writeheader()
        writer.writerows(records)
    (out / "profile.txt").write_text(profile_table)
    print(report)


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--model", help="default: ViT-B-32 on a GPU, csclip-tiny on the CPU")
    parser.add_argument("--quick-gelu", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--image-size", type=int, help="default: 224 on a GPU, 32 on the CPU")
    parser.add_argument("--batches", help="comma-separated per-GPU batch sizes (default 128,256; CPU 8,16)")
    parser.add_argument("--methods", default="clip,negclip,csclip")
    parser.add_argument("--variants", help="eager,compiled (default; CPU: eager)")
    parser.add_argument("--compiled-methods", default="clip,csclip",
                        help="methods that also get a compiled row")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="open_clip_train rows (needs open_clip_train, in the open_clip_torch wheel)")
    parser.add_argument("--num-unit-slots", type=int, default=2)
    parser.add_argument("--precision", default="auto",
                        choices=["auto", "fp32", "bf16", "fp16", "bf16_pure"])
    parser.add_argument("--compile-mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune",
                                 "max-autotune-no-cudagraphs"])
    parser.add_argument("--steps", type=int, help="timed steps per row (default 20; CPU 3)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 5; CPU 2)")
    parser.add_argument("--pool", type=int, default=2, help="distinct batches per size")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--profile-method", default="csclip")
    parser.add_argument("--peak-tflops", type=float, help="peak for MFU (default: by device name)")
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="start no row after this many seconds (default keeps a GPU run < 5 min)")
    parser.add_argument("--compile-reserve-s", type=float, default=45.0,
                        help="start a compiled row only with this much budget left")
    parser.add_argument("--captions", help="SugarCrepe directory (default: shared/data/sugarcrepe)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--estimate-memory", action="store_true",
                        help="estimate peak memory per GPU on fake tensors instead (no GPU needed)")
    parser.add_argument("--out", default="bench_gpu_out", help="directory for the .md/.csv/profile")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.estimate_memory:  # sizes of the GPU run, computed on the CPU
        cuda, args.device = True, "cpu"
    args.device = args.device if args.estimate_memory else ("cuda" if cuda else "cpu")
    args.model = args.model or ("ViT-B-32" if cuda else "csclip-tiny")
    args.image_size = args.image_size or (224 if cuda else 32)
    args.batches = [int(b) for b in (args.batches or ("128,256" if cuda else "8,16")).split(",")]
    args.methods = args.methods.split(",")
    args.variants = (args.variants or ("eager,compiled" if cuda else "eager")).split(",")
    args.compiled_methods = args.compiled_methods.split(",")
    args.steps = args.steps or (20 if cuda else 3)
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    return args


def planned_rows(args) -> list[Row]:
    """Eager rows first (every batch size), then compiled ones: the budget cuts from the end."""
    rows = []
    for variant in args.variants:
        for batch in args.batches:
            if args.baseline:
                rows.append(Row("open_clip_train", "clip", variant, batch))
            methods = args.methods if variant == "eager" else [
                m for m in args.methods if m in args.compiled_methods]
            rows += [Row("csclip", method, variant, batch) for method in methods]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.estimate_memory:
        report = memory_report(args)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "memory.md").write_text(report + "\n")
        print(report)
        return 0
    started = time.perf_counter()
    device = torch.device(args.device)
    from csclip.model import spec_of

    spec = spec_of(fresh_model(args, torch.device("cpu")), args.model)
    records, source = caption_records(max(args.batches) * args.pool, find_captions(args.captions))
    batches = prepare_batches(records, args.batches, args.pool, spec, args.model,
                              args.num_unit_slots, device)
    if args.baseline:
        try:
            import open_clip_train.train  # noqa: F401
        except ImportError as err:
            print(f"open_clip_train not importable ({err}); baseline rows skipped")
            args.baseline = False
    rows, flops = planned_rows(args), {}
    profile_md, profile_table = "Profile: not run (over --budget-s).", ""
    for index, row in enumerate(rows):
        elapsed = time.perf_counter() - started
        reserve = args.compile_reserve_s if row.variant == "compiled" else 0.0
        if elapsed + reserve > args.budget_s:
            row.note = f"skipped: {elapsed:.0f} s of the {args.budget_s:.0f} s budget spent"
            continue
        runner = open_clip_row if row.loop == "open_clip_train" else csclip_row
        runner(row, args, batches[row.batch], device, flops)
        print(f"[{time.perf_counter() - started:6.1f} s] {row.name}, batch {row.batch}: "
              f"{row.samples_per_s:.1f} samples/s, {row.step_ms:.1f} ms/step", flush=True)
        if row.variant == "compiled":
            torch._dynamo.reset()  # drop this row's compiled graphs (and what they hold)
        last_eager = index + 1 == len(rows) or rows[index + 1].variant != "eager"
        if (row.variant == "eager" and last_eager and not profile_table
                and time.perf_counter() - started < args.budget_s):
            profile_md, profile_table = profile_step(args, batches[args.batches[0]], device,
                                                     args.profile_method)
    peak, peak_source = detect_peak(device, args.peak_tflops)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    header = (f"Command: `python benchmarks/bench_gpu.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
              f"\n\n{name}, torch {torch.__version__}, {args.model} (QuickGELU {args.quick_gelu}) at "
              f"{args.image_size} px, random weights, precision {args.precision}, "
              f"{args.steps} timed steps after {args.warmup}, N = {args.num_unit_slots}; texts: "
              f"{source}. MFU peak: {_fmt(peak, '.0f')} TFLOP/s ({peak_source}). "
              f"Total {time.perf_counter() - started:.0f} s.")
    write_outputs(Path(args.out), header, table_rows(rows, peak), profile_md, profile_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
