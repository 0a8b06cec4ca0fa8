"""`csclip extract --format webdataset`: units, rejects and a done marker per input shard,
every sample accounted for (bad ones rejected at the read with their reason), resumable
shard by shard after a SIGKILL, over local and s3:// shards."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from csclip.config import load_config
from csclip.config.extract import ExtractConfig, InputConfig
from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.extract.backends import gold_outcome, rules_outcome
from csclip.extract.captions import iter_world_captions
from csclip.extract.pipeline import run_extraction
from csclip.extract.shards import run_shard_extraction
from csclip.units import read_units
from tests.conftest import REPO_ROOT
from tests.s3_helpers import fresh_bucket
from tests.test_crash_safety import _kill_when
from tests.test_extract_pipeline import recorded_engine

CAPTIONS = ["a red cube on a blue table", "two dogs running on the grass", "a man holding a cup",
            "a small cat under a wooden chair", "a woman riding a brown horse",
            "a green bus next to a tall building", "a boy kicking a white ball",
            "an old car parked near a tree"]
JPEG = b"\xff\xd8\xff\xe0 not decoded by the extraction"


def write_tar(path: Path, samples: list[tuple[str, dict[str, bytes]]], cut: int = 0) -> Path:
    """A shard of `samples` ((key, {suffix: bytes}), members in this order); `cut` bytes
    taken off its end make it a shard cut short."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key, members in samples:
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    path.write_bytes(data[: len(data) - cut])
    return path


def good(key: str, caption: str, **meta) -> tuple[str, dict[str, bytes]]:
    return key, {"jpg": JPEG, "txt": caption.encode(), "json": json.dumps(meta).encode()}


def bad_shards(root: Path) -> str:
    """Three shards: 000 with a sample without caption and one with bad JSON, 001 whole,
    002 cut short inside its last sample's caption. Returns their pattern."""
    root.mkdir(parents=True, exist_ok=True)
    write_tar(root / "000.tar", [good("s000", CAPTIONS[0]),
                                 ("s001", {"jpg": JPEG, "json": b'{"url": "x"}'}),
                                 ("s002", {"jpg": JPEG, "txt": b"a cat", "json": b"{oops"}),
                                 good("s003", CAPTIONS[1], split="val", image_id="img-3")])
    write_tar(root / "001.tar", [good(f"s1{i:02d}", c) for i, c in enumerate(CAPTIONS[2:6])])
    last = [good(f"s2{i:02d}", c) for i, c in enumerate(CAPTIONS[6:8])]
    last.append(("s299", {"jpg": JPEG, "txt": b"a long caption " * 40}))
    write_tar(root / "002.tar", last, cut=1024 + 512 + 300)  # into the caption's data
    return f"{root}/{{000..002}}.tar"


def _config(pattern: str, out: Path, *overrides: str) -> ExtractConfig:
    return load_config(ExtractConfig, None, [
        "input.format=webdataset", f"input.uri={pattern}", "backend.name=rules",
        f"output.uri={out}", "tracking.enabled=false", *overrides])


def _done(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "_done").glob("*.json"))}


def _tables(out: Path) -> dict[str, object]:
    return {f"{folder}/{p.name}": pq.read_table(p)
            for folder in ("units", "rejects") for p in sorted((out / folder).glob("*.parquet"))}


def test_rules_over_shards_accounts_for_every_sample_of_every_shard(ray_session, tmp_path,
                                                                   caplog):
    pattern = bad_shards(tmp_path / "shards")
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="csclip.extract.shards"):
        summary = run_shard_extraction(_config(pattern, out))
    progress = [r.getMessage() for r in caplog.records if " written (" in r.getMessage()]
    assert len(progress) == 3 and re.fullmatch(
        r"extract: shard 00\d written \(3/3 shards, \d+ captions/s, ETA 0:00:00\)", progress[-1])

    done = _done(out)
    assert sorted(done) == ["000", "001", "002"]
    for stem, counts in done.items():
        assert counts["read"] == counts["with_units"] + counts["rejected"]
        assert counts["uri"] == str(tmp_path / "shards" / f"{stem}.tar")
    assert done["000"]["read"] == 4 and done["000"]["rejected_by_reason"] == {
        "no_caption": 1, "bad_json": 1}
    assert done["001"]["read"] == 4
    # The cut falls inside s299: the two samples before it are whole, s299 is the cut.
    assert done["002"]["read"] == 3
    assert done["002"]["rejected_by_reason"] == {"truncated_shard": 1}
    rejects = pq.read_table(out / "rejects" / "000.parquet").to_pylist()
    read_rejects = {r["sample_id"]: r for r in rejects if r["stage"] == "read"}
    assert {k: (r["level"], r["reason"]) for k, r in read_rejects.items()} == {
        "s001": ("record", "no_caption"), "s002": ("record", "bad_json")}

    assert (summary.read, summary.num_shards, summary.shards_written) == (11, 3, 3)
    assert summary.read == summary.with_units + summary.rejected
    assert summary.rejected_by_reason["no_caption"] == 1
    assert (out / "_complete.json").is_file()
    # What the rules backend makes of each whole sample, read as the shards say.
    whole = {"s000": CAPTIONS[0], "s003": CAPTIONS[1], **{f"s1{i:02d}": c for i, c in
             enumerate(CAPTIONS[2:6])}, "s200": CAPTIONS[6], "s201": CAPTIONS[7]}
    direct = {k: rules_outcome({"sample_id": k, "image_id": k, "caption": c, "split": "train"})
              for k, c in whole.items()}
    units = {r.sample_id: r for r in read_units(str(out / "units"))}
    assert units.keys() == {k for k, o in direct.items() if o.record is not None}
    assert all(units[k].units == direct[k].record.units for k in units)
    assert (units["s003"].split, units["s003"].image_id) == ("val", "img-3")
    assert units["s100"].meta["shard"] == "001" and units["s100"].image_path is None


def world_shards(root: Path, num_shards: int) -> tuple[str, list[dict]]:
    """The world's captions in shards as `csclip shards` writes them (gold units in the
    JSON's gold_json), and the caption rows."""
    root.mkdir(parents=True)
    world = WorldConfig(num_train=5, num_val=2, num_test=1)
    rows = list(iter_world_captions(InputConfig(world=world)))
    for k in range(num_shards):
        write_tar(root / f"{k:05d}.tar", [
            (row["sample_id"], {"png": row["image_bytes"], "txt": row["caption"].encode(),
                                "json": json.dumps({k: row[k] for k in (
                                    "sample_id", "image_id", "split", "gold_json")}).encode()})
            for row in rows[k::num_shards]])
    return f"{root}/{{00000..{num_shards - 1:05d}}}.tar", rows


def test_gold_over_the_worlds_shards_passes_its_units_through(ray_session, tmp_path):
    pattern, rows = world_shards(tmp_path / "shards", 3)
    out = tmp_path / "out"
    summary = run_shard_extraction(_config(pattern, out, "backend.name=gold"))
    assert (summary.read, summary.with_units, summary.num_shards) == (8, 8, 3)
    units = {r.sample_id: r for r in read_units(str(out / "units"))}
    for row in rows:
        gold = gold_outcome(row).record
        assert (units[gold.sample_id].units, units[gold.sample_id].split) == (gold.units, gold.split)


@pytest.mark.parametrize("backend", ["rules", "vllm"])
def test_a_key_in_two_shards_is_refused_naming_both(ray_session, tmp_path, backend):
    root = tmp_path / "shards"
    root.mkdir()
    write_tar(root / "000.tar", [good("a", CAPTIONS[0]), good("twice", CAPTIONS[1])])
    write_tar(root / "001.tar", [good("twice", CAPTIONS[2])])
    write_tar(root / "002.tar", [good("twice", CAPTIONS[3])])
    # rules: whichever shard's task ends first is the one written first. vllm: a window of
    # two, then the third shard against the two written.
    with pytest.raises(DataError, match=r"key 'twice' is in shard 00\d and in shard 00\d"):
        run_shard_extraction(_config(f"{root}/{{000..001}}.tar", tmp_path / "out",
                                     f"backend.name={backend}", "output.shards_per_window=2"),
                             engine=recorded_engine())
    with pytest.raises(DataError, match=r"key 'twice' is in shard 000 and in shard 002"):
        run_shard_extraction(_config(f"{root}/{{000,002}}.tar", tmp_path / "out2",
                                     f"backend.name={backend}", "output.shards_per_window=1"),
                             engine=recorded_engine())


def test_vllm_over_shards_in_windows_equals_the_caption_file_run(ray_session, sugarcrepe_dir,
                                                                 tmp_path):
    """The engine stage over windows of shards (recorded answers, with repairs and an
    engine error) gives each caption the units the caption-file pipeline gives it."""
    captions = json.loads((sugarcrepe_dir / "add_att.json").read_text())
    ids = [f"sugarcrepe-add_att-{int(k):06d}" for k in list(captions)[:10]]
    root = tmp_path / "shards"
    root.mkdir()
    for k in range(4):  # 3, 3, 3, 1 captions; shard 003 also a sample without caption
        samples = [good(i, captions[str(int(i[-6:]))]["caption"], split="test")
                   for i in ids[3 * k:3 * k + 3]]
        write_tar(root / f"{k:03d}.tar", samples + ([("nocap", {"jpg": JPEG})] if k == 3 else []))
    summary = run_shard_extraction(_config(f"{root}/{{000..003}}.tar", tmp_path / "out",
                                           "backend.name=vllm", "output.shards_per_window=2"),
                                   engine=recorded_engine())
    files = run_extraction(load_config(ExtractConfig, None, [
        "input.format=sugarcrepe", f"input.uri={sugarcrepe_dir}/add_att.json", "input.limit=10",
        "backend.name=vllm", f"output.uri={tmp_path / 'files'}", "tracking.enabled=false"]),
        engine=recorded_engine())
    assert (summary.read, summary.with_units) == (files.read + 1, files.with_units)
    assert summary.rejected_by_reason == {**files.rejected_by_reason, "no_caption": 1}
    from_shards = {r.sample_id: r.units for r in read_units(str(tmp_path / "out" / "units"))}
    from_files = {r.sample_id: r.units for r in read_units(str(tmp_path / "files" / "units"))}
    assert from_shards == from_files and len(from_files) == files.with_units


# The extraction driver, joined to the test session's Ray; a pause after each shard's
# marker so the kill lands between shards.
_EXTRACTOR = textwrap.dedent("""
    import sys, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
    from csclip.config import load_config
    from csclip.config.extract import ExtractConfig
    from csclip.extract.shards import run_shard_extraction
    run_shard_extraction(load_config(ExtractConfig, None, sys.argv[2:]),
                         on_shard_written=lambda stem: time.sleep(1.0))
""")


def test_killed_mid_run_the_same_command_redoes_only_unfinished_shards(ray_session, tmp_path):
    root = tmp_path / "shards"
    root.mkdir()
    for k in range(6):
        write_tar(root / f"{k:03d}.tar", [good(f"k{k}-{i}", c)
                                          for i, c in enumerate(CAPTIONS[k:k + 3])])
    pattern = f"{root}/{{000..005}}.tar"
    out = tmp_path / "out"
    overrides = ["input.format=webdataset", f"input.uri={pattern}", "backend.name=rules",
                 f"output.uri={out}", "tracking.enabled=false", "output.shards_per_window=2"]
    process = subprocess.Popen(
        [sys.executable, "-c", _EXTRACTOR, ray_session.get_runtime_context().gcs_address,
         *overrides], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _kill_when(process, lambda: len(list((out / "_done").glob("*.json"))) >= 2, "extraction",
               seconds=240)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "_done").glob("*.json")}
    assert 2 <= len(before) < 6
    with pytest.raises(DataError, match=f"stopped at shard {len(before)} of 6"):
        read_units(str(out / "units"))

    summary = run_shard_extraction(load_config(ExtractConfig, None, overrides))
    assert (summary.shards_written, summary.shards_skipped) == (6 - len(before), len(before))
    after = {p.name: p.stat().st_mtime_ns for p in (out / "_done").glob("*.json")}
    assert {name: after[name] for name in before} == before  # not redone
    # The same tables as a run that was never interrupted.
    whole = tmp_path / "whole"
    run_shard_extraction(_config(pattern, whole, "output.shards_per_window=2"))
    assert _tables(out) == _tables(whole) and len(_tables(out)) == 12
    with pytest.raises(DataError, match="different backend"):
        run_shard_extraction(_config(pattern, out, "backend.name=gold"))


def test_the_cli_extracts_a_shard_pattern(ray_session, tmp_path, capsys):
    from csclip.entry.extract import main

    pattern = bad_shards(tmp_path / "shards")
    out = tmp_path / "out"
    argv = ["--backend", "rules", "--format", "webdataset", "--input", pattern, "--out", str(out),
            "--set", "tracking.enabled=false"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "read 11 = with units" in printed and "rejected truncated_shard: 1" in printed
    assert sorted(p.name for p in (out / "units").glob("*.parquet")) == [
        "000.parquet", "001.parquet", "002.parquet"]
    # A shard the pattern names but the disk lacks: one line, before Ray is asked for work.
    missing = ["--backend", "rules", "--format", "webdataset", "--input",
               f"{tmp_path}/shards/{{000..004}}.tar", "--out", str(tmp_path / "other")]
    assert main(missing) == 2
    assert "2 of 5 shards do not exist" in capsys.readouterr().err


# A driver joined to the session's Ray whose job's workers get its S3 credentials and
# NLTK_DATA (on a cluster: the instance profile, and the image's NLTK data): the shard
# tasks open the shards and run the caption shuffles. Prints the summary's counts.
_JOINED_EXTRACTOR = textwrap.dedent("""
    import json, os, sys
    import ray
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_") or k == "NLTK_DATA"}
    ray.init(address=sys.argv[1], runtime_env={"env_vars": env}, log_to_driver=False,
             configure_logging=False)
    from csclip.config import load_config
    from csclip.config.extract import ExtractConfig
    from csclip.extract.shards import run_shard_extraction
    summary = run_shard_extraction(load_config(ExtractConfig, None, sys.argv[2:]))
    print(json.dumps([summary.read, summary.with_units, summary.rejected_by_reason]))
""")


def _joined(ray_session, overrides: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _JOINED_EXTRACTOR,
                           ray_session.get_runtime_context().gcs_address, *overrides],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env})


def test_s3_shards_are_read_by_the_tasks(ray_session, s3_endpoint, monkeypatch, tmp_path):
    pattern = bad_shards(tmp_path / "shards")
    local = run_shard_extraction(_config(pattern, tmp_path / "local"))
    with fresh_bucket(s3_endpoint, monkeypatch, "csclip-shards") as s3:
        for k in range(3):
            s3.upload_file(str(tmp_path / "shards" / f"00{k}.tar"), "csclip-shards",
                           f"laion/00{k}.tar")
        overrides = ["input.format=webdataset", "input.uri=s3://csclip-shards/laion/{000..002}.tar",
                     "backend.name=rules", "tracking.enabled=false",
                     "output.uri=s3://csclip-shards/units"]
        done = _joined(ray_session, overrides)
        assert done.returncode == 0, done.stderr[-3000:]
        marker = json.loads(s3.get_object(Bucket="csclip-shards", Key="units/_done/001.json")[
            "Body"].read())
        # A shard the bucket lacks stops the run in one line: no marker says it was read.
        missing = _joined(ray_session, [
            *overrides[:1], "input.uri=s3://csclip-shards/laion/{002..003}.tar",
            *overrides[2:4], "output.uri=s3://csclip-shards/other"])
        others = {o["Key"] for o in s3.list_objects_v2(
            Bucket="csclip-shards", Prefix="other/_done/").get("Contents", [])}
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        local.read, local.with_units, local.rejected_by_reason]
    assert marker["uri"] == "s3://csclip-shards/laion/001.tar" and marker["read"] == 4
    assert missing.returncode != 0
    assert "DataError: cannot open shard s3://csclip-shards/laion/003.tar" in missing.stderr
    assert "other/_done/003.json" not in others  # 002 may have finished before


def test_swap_negatives_go_into_each_shards_units(ray_session, tmp_path):
    pytest.importorskip("spacy")
    pytest.importorskip("nltk")
    from swap_negatives_helpers import tagged_pipeline, untrained_punkt

    from csclip.config.world import PALETTE, SHAPES, SIZES
    from csclip.units import stored_shuffles

    model = tmp_path / "tagger"
    tagged_pipeline({"NOUN": list(SHAPES), "ADJ": [*PALETTE, *SIZES]}).to_disk(model)
    pattern, _ = world_shards(tmp_path / "shards", 2)
    done = _joined(ray_session, [
        "input.format=webdataset", f"input.uri={pattern}", "backend.name=gold",
        f"output.uri={tmp_path / 'out'}", "tracking.enabled=false",
        "swap_negatives.enabled=true", f"swap_negatives.spacy_model={model}"],
        NLTK_DATA=str(untrained_punkt(tmp_path / "nltk_data")))
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_units(str(tmp_path / "out" / "units"))
    assert len(records) == 8 and all(stored_shuffles(r) for r in records)
    assert {r.meta["shard"] for r in records} == {"00000", "00001"}
