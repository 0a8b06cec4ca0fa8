"""benchmarks/bench_gpu.py runs on the CPU with a tiny model, writes its table, and never
imports Ray (the GPU machine has none)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_bench_gpu_runs_on_cpu_and_never_imports_ray(tmp_path):
    out = tmp_path / "bench"
    code = (
        "import sys\n"
        "import benchmarks.bench_gpu as bench\n"
        "assert 'ray' not in sys.modules, 'importing bench_gpu imported ray'\n"
        f"bench.main(['--device', 'cpu', '--batches', '4', '--methods', 'clip,csclip',\n"
        f"            '--steps', '1', '--warmup', '2', '--pool', '1', '--profile-steps', '1',\n"
        f"            '--out', {str(out)!r}])\n"
        "assert 'ray' not in sys.modules, 'running bench_gpu imported ray'\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with (out / "bench_gpu.csv").open() as handle:
        rows = {row["loop"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"open_clip_train (ClipLoss)", "csclip --method clip",
                         "csclip --method csclip"}
    for row in rows.values():
        assert row["batch"] == "4" and float(row["samples/s"]) > 0 and float(row["step ms"]) > 0
    # FLOPs from FlopCounterMode: CS-CLIP encodes 6 texts per image instead of 1.
    clip_flops = float(rows["csclip --method clip"]["GFLOP/step"])
    assert float(rows["csclip --method csclip"]["GFLOP/step"]) > 1.5 * clip_flops > 0
    assert rows["open_clip_train (ClipLoss)"]["vs open_clip_train"] == "1.00"
    report = (out / "bench_gpu.md").read_text()
    assert "| csclip --method csclip | 4 |" in report and "Profile: 1 eager steps" in report
    assert "scaled_dot_product" in (out / "profile.txt").read_text()


def test_world_captions_stand_in_when_sugarcrepe_is_absent():
    sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.bench_gpu import caption_records

    records, source = caption_records(3, None)
    assert len(records) == 3 and source.startswith("world")
    assert all(r.image_bytes and r.units for r in records)


def test_memory_estimate_counts_state_exactly_and_activations_shrink_with_accumulation():
    sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.bench_gpu import estimate_memory, parse_args

    # Fake tensors cost the same at any batch size; at 512 activations outweigh AdamW's
    # temporaries, as they do for ViT-B-32 at 128.
    args = parse_args(["--estimate-memory", "--model", "csclip-tiny", "--image-size", "32",
                       "--batches", "512"])
    held, peak = estimate_memory(args, "csclip", 512)
    # Known answer for what a step leaves behind: fp32 weights, gradients and AdamW's two
    # moments (16 bytes a weight) and a 4-byte step count per tensor, the attention-mask
    # buffer (32 x 32 fp32), and the batch (image, 6 token columns, unit and negative masks).
    from csclip.model import create_bundle

    params = list(create_bundle("csclip-tiny", image_size=32).model.parameters())
    batch_bytes = 512 * (3 * 32 * 32 * 4 + 6 * 32 * 8 + 2)
    expected = 16 * sum(p.numel() for p in params) + 4 * len(params) + 32 * 32 * 4 + batch_bytes
    assert held * 2**30 == expected
    _, accumulated = estimate_memory(args, "csclip", 512, accum_freq=4)
    _, checkpointed = estimate_memory(args, "csclip", 512, grad_checkpointing=True)
    assert held < accumulated < 0.75 * peak and held < checkpointed < 0.75 * peak
