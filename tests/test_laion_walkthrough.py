"""The LAION-style walk-through of docs/cluster.md ("A LAION-style run on shards"), read
from the doc and run in order on one machine: shards from a CSV of real captions (COCO's,
from SugarCrepe's files) and small images, units per shard with the rules, training on
the shards, retrieval on the shards held out. What stands in for the cluster is
REHEARSAL_CHANGES; a change of the doc that no longer matches it fails the test."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from test_quickstart import parse_blocks

from csclip import cli
from csclip.eval.report import EVALUATION_COMPLETE
from csclip.shards import expand_shards
from csclip.shards.read import iter_shard

REPO = Path(__file__).resolve().parents[1]
CLUSTER_DOC = REPO / "docs" / "cluster.md"
SECTION = ("## A LAION-style run on shards", "## Watching it")
NUM_CAPTIONS = 64
# The doc's text and the rehearsal's: each must occur in the walk-through.
REHEARSAL_CHANGES: tuple[tuple[str, str], ...] = (
    ("--samples-per-shard 10000", "--samples-per-shard 16"),
    ("{00000..41407}", "{00000..00003}"),
    ("{00000..41405}", "{00000..00002}"),
    ("{41406..41407}", "{00003..00003}"),
    ("--config configs/laion.yaml", "--config configs/laion.yaml --model csclip-tiny "
     "--set model.pretrained=null --set model.quick_gelu=false --set model.image_size=32 "
     "--set run.use_gpu=false --set run.num_workers=1 --set run.cpus_per_worker=1 "
     "--set run.worker_resources={} --set run.precision=fp32 --set data.batch_size=8 "
     "--set optim.warmup_steps=0 --set optim.lr=1e-4 --set optim.max_steps=4 "
     "--set run.checkpoint_every=4 --no-tracking"),
    ("python pipelines/evaluate.py", "python pipelines/evaluate.py --no-tracking "
     "--set data.world.num_val=40 --set data.world.image_size=32 --set benchmark.num_bootstrap=50"),
)
SCRIPTS = {"pipelines/shards.py": "shards", "pipelines/extract_units.py": "extract",
           "pipelines/train.py": "train", "pipelines/evaluate.py": "evaluate"}
SUBMIT = "ray job submit --working-dir . -- python "


def walkthrough() -> list[str]:
    text = CLUSTER_DOC.read_text()
    start, end = (text.index(marker) for marker in SECTION)
    [block] = parse_blocks(text[start:end])
    return [command.text for command in block.commands]


def rehearsal(bucket: Path) -> list[list[str]]:
    """The walk-through's commands as the rehearsal runs them: argv of a csclip command."""
    commands = walkthrough()
    joined = "\n".join(commands)
    for doc_text, ours in REHEARSAL_CHANGES:
        assert doc_text in joined, f"the walk-through no longer has {doc_text!r}"
        commands = [c.replace(doc_text, ours) for c in commands]
    argvs = []
    for command in commands:
        command = command.replace("s3://MY-BUCKET", str(bucket))
        assert command.startswith(SUBMIT), command
        script, *args = shlex.split(command[len(SUBMIT):], comments=True)
        argvs.append([SCRIPTS[script], *args])
    return argvs


def test_the_walkthrough_is_four_jobs_of_the_pipelines():
    argvs = rehearsal(Path("/bucket"))
    assert [argv[0] for argv in argvs] == ["shards", "extract", "train", "evaluate"]


def _write_csv_input(bucket: Path, sugarcrepe: Path) -> None:
    """64 real COCO captions, each with a small image of random pixels."""
    captions = [item["caption"] for item in
                json.loads((sugarcrepe / "add_att.json").read_text()).values()]
    images = bucket / "cc" / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with (bucket / "cc" / "train.csv").open("w", newline="") as out:
        writer = csv.writer(out, delimiter="\t")  # open_clip_train's csv: tab-separated
        writer.writerow(["filepath", "title"])
        for index, caption in enumerate(captions[:NUM_CAPTIONS]):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(images / f"{index:03d}.jpg", quality=90)
            writer.writerow([f"{index:03d}.jpg", caption])


@pytest.mark.slow
def test_the_laion_style_walkthrough_on_local_shards(ray_session, tmp_path, monkeypatch,
                                                     sugarcrepe_dir):
    bucket = tmp_path / "bucket"
    _write_csv_input(bucket, sugarcrepe_dir)
    monkeypatch.chdir(REPO)  # the jobs run from the project root (configs/laion.yaml)
    shards_argv, extract_argv, train_argv, evaluate_argv = rehearsal(bucket)

    assert cli.main(shards_argv) == 0
    uris = expand_shards(f"{bucket}/laion/{{00000..00003}}.tar")
    keys = [s.key for uri in uris for s in iter_shard(uri, images=False)]
    assert len(keys) == len(set(keys)) == NUM_CAPTIONS

    assert cli.main(extract_argv) == 0
    units = bucket / "units" / "laion-rules"
    done = {p.stem: json.loads(p.read_text()) for p in (units / "_done").glob("*.json")}
    assert sorted(done) == ["00000", "00001", "00002", "00003"]
    for counts in done.values():  # read = units + rejected, per shard
        assert counts["read"] == counts["with_units"] + counts["rejected"] == 16
    with_units = sum(c["with_units"] for c in done.values())
    assert with_units >= NUM_CAPTIONS // 2  # the rules find units in most real captions
    assert pq.read_table(units / "units" / "00000.parquet").num_rows == done["00000"]["with_units"]
    # A rerun finds every shard done and writes none.
    assert cli.main(extract_argv) == 0

    assert cli.main(train_argv) == 0
    final = bucket / "runs" / "laion" / "final"
    assert (final / "metrics.json").is_file()
    assert json.loads((final / "metrics.json").read_text())["step"] == 4

    assert cli.main(evaluate_argv) == 0
    out = bucket / "eval" / "laion"
    assert (out / EVALUATION_COMPLETE).is_file()
    results = "\n".join(p.read_text() for p in out.rglob("*.json"))
    assert "laion_heldout" in results
