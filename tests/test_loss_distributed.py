"""Parity of the gathered losses: 2 gloo workers (torch.multiprocessing, 127.0.0.1) compute
the same loss, and the same gradients up to DDP's averaging, as one process on the
concatenated batch; with gather=False (loss.gather) each worker's loss is its local
batch's, and DDP's average is the gradient of the mean of the per-worker losses."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from csclip.loss import clip_loss, csclip_loss

WORLD_SIZE = 2
GLOBAL_BATCH, SLOTS, DIM = 6, 2, 8
# Rows per worker: equal shards, and a last partial batch where the workers differ.
SPLITS = {"even": (3, 3), "uneven": (4, 2)}
# Generous: two fresh interpreters import torch on a shared, loaded 2-core machine.
JOIN_TIMEOUT_S = 180


def _global_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    batch = GLOBAL_BATCH

    def features(*shape: int) -> torch.Tensor:
        return F.normalize(torch.randn(*shape, generator=generator), dim=-1)

    return {
        "image": features(batch, DIM), "caption": features(batch, DIM),
        "caption_negative": features(batch, DIM),
        "units": features(SLOTS, batch, DIM), "foils": features(SLOTS, batch, DIM),
        # A masked sample on each rank in both splits, so masking and gathering meet.
        "mask": torch.tensor([True, False, True, True, True, False]),
        # Samples without a caption negative, on both ranks in both splits.
        "negative_mask": torch.tensor([True, True, False, True, False, True]),
    }


FEATURES = ("image", "caption", "caption_negative", "units", "foils")
MASKS = ("mask", "negative_mask")


def _losses(inputs: dict[str, torch.Tensor], scale: torch.Tensor,
            gather: bool = True) -> dict[str, torch.Tensor]:
    parts = csclip_loss(inputs["image"], inputs["caption"], inputs["caption_negative"],
                        inputs["units"], inputs["foils"], inputs["mask"], scale, 0.5,
                        negative_mask=inputs["negative_mask"], gather=gather)
    return {"full": parts.full, "unit": parts.unit, "total": parts.total,
            "clip": clip_loss(inputs["image"], inputs["caption"], scale, gather=gather)}


def _gradients(inputs, scale, loss) -> dict[str, torch.Tensor]:
    leaves = [inputs[name] for name in FEATURES] + [scale]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    # The plain CLIP loss does not use negatives, units or foils: their gradient is zero.
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]
    return dict(zip([*FEATURES, "scale"], grads, strict=True))


def _rows(split: str, rank: int) -> slice:
    sizes = SPLITS[split]
    return slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))


def _local(inputs: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    return {name: value[:, rows] if name in ("units", "foils") else value[rows]
            for name, value in inputs.items()}


def _worker(rank: int, out_dir: str) -> None:
    # A file rendezvous, not tcp://127.0.0.1:<free port>: a port found free and bound later
    # can be taken in between (Ray and other tests open ports), and there is none to pick.
    # The timeout covers the slower worker's start: on a loaded 2-core machine one fresh
    # interpreter may import torch a minute after the other.
    dist.init_process_group("gloo", init_method=f"file://{Path(out_dir) / 'rendezvous'}",
                            rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    try:
        result = {}
        for split in SPLITS:
            for gather, tag in ((True, ""), (False, "local_")):
                local = {name: value.clone().requires_grad_(name not in MASKS)
                         for name, value in _local(_global_inputs(), _rows(split, rank)).items()}
                scale = torch.tensor(12.5, requires_grad=True)
                losses = _losses(local, scale, gather)
                result.update({f"{tag}{split}_loss_{k}": v.detach() for k, v in losses.items()})
                for kind in ("total", "clip"):
                    grads = _gradients(local, scale, losses[kind])
                    result.update({f"{tag}{split}_grad_{kind}_{k}": v for k, v in grads.items()})
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_workers_match_one_process_on_the_concatenated_batch(tmp_path):
    # spawn, not fork: fork is faster (no second torch import) but hangs the children when
    # the parent has already used its OpenMP thread pool (any earlier torch test).
    context = mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD_SIZE,
                       join=False)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not context.join(timeout=1):  # raises if a worker failed
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"gloo workers did not finish within {JOIN_TIMEOUT_S} s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]

    inputs = {k: v.clone().requires_grad_(k not in MASKS) for k, v in _global_inputs().items()}
    scale = torch.tensor(12.5, requires_grad=True)
    losses = _losses(inputs, scale)
    single = {kind: _gradients(inputs, scale, losses[kind]) for kind in ("total", "clip")}
    for split in SPLITS:
        for rank, result in enumerate(ranks):
            for name, value in losses.items():
                # Every worker computes the global loss itself.
                torch.testing.assert_close(result[f"{split}_loss_{name}"], value.detach(),
                                           atol=1e-6, rtol=0)
            for kind in ("total", "clip"):
                expected = _local({n: single[kind][n] for n in FEATURES}, _rows(split, rank))
                for name in FEATURES:
                    # The gather's backward sums the W workers' (identical) gradients of
                    # this worker's rows, so a worker holds W·∂L/∂x_local; DDP averages
                    # parameter gradients over W, giving ∂L/∂θ.
                    torch.testing.assert_close(result[f"{split}_grad_{kind}_{name}"],
                                               WORLD_SIZE * expected[name], atol=1e-6, rtol=0)
                # logit_scale is replicated, not gathered: each worker has ∂L/∂scale
                # itself, and DDP's average of W equal values leaves it unchanged.
                torch.testing.assert_close(result[f"{split}_grad_{kind}_scale"],
                                           single[kind]["scale"], atol=1e-6, rtol=0)
    # The masked samples (global rows 1 and 5) get no unit gradient.
    assert torch.all(ranks[0]["even_grad_total_units"][:, 1] == 0)
    assert torch.all(ranks[1]["uneven_grad_total_units"][:, 1] == 0)

    # loss.gather = False: each worker's loss is the one process's loss on that worker's
    # rows alone; its feature gradients are those of the mean of the per-worker losses
    # times W (the same convention as above), and DDP's average of the logit_scale
    # gradients is the mean loss's: together, training on mean_r L_r.
    for split in SPLITS:
        inputs = {k: v.clone().requires_grad_(k not in MASKS) for k, v in _global_inputs().items()}
        scale = torch.tensor(12.5, requires_grad=True)
        shards = [_local(inputs, _rows(split, rank)) for rank in range(WORLD_SIZE)]
        per_worker = [_losses(shard, scale, gather=False) for shard in shards]
        for kind in ("total", "clip"):
            mean = torch.stack([losses[kind] for losses in per_worker]).mean()
            expected = _gradients(inputs, scale, mean)
            for rank, result in enumerate(ranks):
                torch.testing.assert_close(result[f"local_{split}_loss_{kind}"],
                                           per_worker[rank][kind].detach(), atol=1e-6, rtol=0)
                local_expected = _local({n: expected[n] for n in FEATURES}, _rows(split, rank))
                for name in FEATURES:
                    torch.testing.assert_close(result[f"local_{split}_grad_{kind}_{name}"],
                                               WORLD_SIZE * local_expected[name], atol=1e-6, rtol=0)
            averaged = torch.stack([r[f"local_{split}_grad_{kind}_scale"] for r in ranks]).mean()
            torch.testing.assert_close(averaged, expected["scale"], atol=1e-6, rtol=0)
        # Different local batches give different losses: nothing was gathered.
        assert ranks[0][f"local_{split}_loss_total"] != ranks[1][f"local_{split}_loss_total"]
