"""benchmarks/bench_scale.py on its smallest sets: a driver probe in a fresh process that
joins the test's Ray, an epoch of csclip's pipeline and of open_clip_train's webdataset
pipeline over the same shards delivering every sample, and the last line in the form
docs/performance.md quotes."""

from __future__ import annotations

import re

from benchmarks import bench_scale

LAST_LINE = re.compile(r"driver MB at 2/4 shards: -?[\d.]+/-?[\d.]+; first batch s: [\d.]+/[\d.]+; "
                       r"csclip/open_clip webdataset CPU ratio [\d.]+")


def test_both_pipelines_deliver_every_sample_of_the_same_shards(tmp_path, ray_session):
    sets = bench_scale.write_sets(tmp_path, [2, 4], 32, 1)
    small, large = sets[0, 2], sets[0, 4]
    probe = bench_scale.run_probe(small, 1, ray_session.get_runtime_context().gcs_address)
    assert probe["rows"] == small.samples == 64
    assert probe["first_batch_s"] > probe["planning_s"] > 0
    assert probe["driver_peak_mb"] >= probe["driver_planned_mb"]  # a high-water mark
    open_clip = bench_scale.OpenClipProcess()
    try:
        cpu = bench_scale.TreeCpu(exclude=(open_clip.process.pid,))
        ours = bench_scale.csclip_epoch(large, 1, cpu)
        theirs = open_clip.epoch(large, 1)
    finally:
        open_clip.close()
    # 128 samples, 4 batches of 32: neither side drops one.
    assert ours.samples == theirs.samples == large.samples == 128
    assert ours.cpu_s > 0 and theirs.cpu_s > 0
    assert ours.read_tasks >= 1  # Ray Data's stats name the read operator
    line = bench_scale.last_line([2, 4], {2: probe, 4: probe}, theirs.cpu_s / ours.cpu_s)
    assert LAST_LINE.fullmatch(line), line
