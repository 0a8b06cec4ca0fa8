"""The random generators a training worker draws from, saved with each checkpoint and
restored on resume: torch's CPU generator (and the worker's CUDA device's), Python's
`random` and NumPy's global generator. A restarted worker then draws, from its first step
on, what the uninterrupted worker drew: dropout, stochastic layers or any model code that
samples on the worker gives the same steps after a restart.

The data needs none of this: its order, the local shuffle buffer, the text slots and the
augmentations are seeded by the config (csclip.train.stream) and drawn in Ray Data.

Every state is a dict of CPU tensors (no NumPy arrays, no tuples), so a checkpoint's
train_state.pt loads with `torch.load(weights_only=True)`. No Ray here; the gather across
ranks takes torch.distributed's process group when there is one.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

RngState = dict[str, Tensor]


def seed_all(seed: int) -> None:
    """Seed torch (every device), Python's random and NumPy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def capture(device: torch.device) -> RngState:
    """This process's generator states; `cuda` only when `device` is a CUDA device."""
    version, internal, gauss_next = random.getstate()
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "torch_cpu": torch.get_rng_state(),                                     # uint8
        # Python's Mersenne Twister: 624 words and the position; the Box-Muller spare.
        "python": torch.tensor([version, *internal], dtype=torch.int64),        # (626,)
        "python_gauss": torch.tensor([gauss_next is not None, gauss_next or 0.0],
                                     dtype=torch.float64),
        "numpy": torch.tensor([*keys.tolist(), position, has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached_gaussian], dtype=torch.float64),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore(state: RngState, device: torch.device) -> None:
    """Set this process's generators to `state` (as `capture` gave it)."""
    torch.set_rng_state(state["torch_cpu"])
    python = state["python"].tolist()
    has_gauss, gauss = state["python_gauss"].tolist()
    random.setstate((python[0], tuple(python[1:]), gauss if has_gauss else None))
    numpy = state["numpy"].tolist()
    np.random.set_state(("MT19937", np.asarray(numpy[:-2], dtype=np.uint32), numpy[-2],
                         numpy[-1], float(state["numpy_gauss"].item())))
    if device.type == "cuda":
        if "cuda" not in state:
            raise ValueError("the saved generator states have no CUDA state: they were "
                             "saved by a CPU run")
        torch.cuda.set_rng_state(state["cuda"], device)


def gather(state: RngState, world_size: int) -> list[RngState]:
    """Every rank's `state`, in rank order (a collective: every rank calls it)."""
    if world_size == 1:
        return [state]
    # NCCL moves CUDA tensors only; gloo CPU ones.
    on = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    ranks: list[RngState] = [{} for _ in range(world_size)]
    for key in sorted(state):  # every rank holds the same keys (one device type per run)
        parts = [torch.empty_like(state[key], device=on) for _ in range(world_size)]
        dist.all_gather(parts, state[key].to(on))
        for rank, part in enumerate(parts):
            ranks[rank][key] = part.cpu()
    return ranks
