"""Features gathered across workers with their gradient, so that every worker's loss sees
the negatives of the global batch (open_clip's gather_features(gather_with_grad=True));
the identity outside torch.distributed. csclip.loss gathers inside each loss."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gather_features", "gather_if", "gather_mask", "is_distributed"]



def is_distributed() -> bool:
    """Whether torch.distributed runs with more than one worker."""
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


class _AllGatherWithGrad(torch.autograd.Function):
    """Concatenate every worker's rows (dim 0); the backward sums the gradient over workers
    and keeps this worker's rows (SimCLR's GatherLayer). Written out because
    torch.distributed.nn.all_gather warns that it is deprecated (its suggested replacement
    is private API), and so that workers may hold different numbers of rows (a last,
    partial batch): rows are padded to the largest worker's count for the collective."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        count = torch.tensor([x.shape[0]], device=x.device)
        counts = [torch.empty_like(count) for _ in range(world)]
        torch.distributed.all_gather(counts, count)
        sizes = [int(c) for c in counts]
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(world)]
        torch.distributed.all_gather(parts, padded)
        ctx.start, ctx.stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad)                       # sum over workers
        return grad[ctx.start:ctx.stop]


def gather_features(x: Tensor, dim: int = 0) -> Tensor:
    """Concatenate `x` from every worker along `dim`, keeping the gradient.

    Like open_clip's `gather_features(gather_with_grad=True)`: the backward sums, over
    workers, the gradient each worker computes for this worker's slice. Every worker
    computes the same global loss L, so the local gradient is world_size · ∂L/∂x_local;
    DDP then *averages* parameter gradients over workers, which gives exactly ∂L/∂θ (the
    world_size cancels). This is open_clip's `local_loss=False` convention.

    Workers may differ in size along `dim` (e.g. a last, partial batch); all other
    dimensions must match. Identity when torch.distributed is not initialised or has one
    worker.
    """
    if not is_distributed():
        return x
    gathered = _AllGatherWithGrad.apply(x.movedim(dim, 0))
    return gathered.movedim(0, dim)


def gather_mask(mask: Tensor, gather: bool = True) -> Tensor:
    """`mask` from every worker (gather=True and distributed), else this worker's, as bool.
    It carries no gradient; gathered as uint8 (gloo has no bool all_gather)."""
    if not gather or not is_distributed():
        return mask.bool()
    return _AllGatherWithGrad.apply(mask.to(torch.uint8)).bool()


def gather_if(x: Tensor, gather: bool, dim: int = 0) -> Tensor:
    """gather_features(x) when `gather`, else this worker's rows only (the local batch is
    the whole batch)."""
    return gather_features(x, dim) if gather else x
