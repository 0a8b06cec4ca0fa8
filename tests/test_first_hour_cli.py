"""A new user's first commands: `extract --input FILE` reads that file in the format its
name says (never the synthetic world), `--no-tracking` logs nothing, `csclip --version`,
and a typo in a setting refused with its near miss before torch is imported."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from csclip.config import load_config
from csclip.config.extract import ExtractConfig
from csclip.config.train import TrainConfig
from csclip.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[1]


def _input(**fields):
    from csclip.config.extract import InputConfig

    return InputConfig.model_validate(fields)


def test_a_txt_file_is_one_caption_a_line_not_the_world(tmp_path):
    from csclip.extract.captions import caption_table

    path = tmp_path / "captions.txt"
    path.write_text("A red cube left of a blue ball.\n\n  Two dogs on a bench.  \n")
    rows = caption_table(_input(uri=str(path))).to_pylist()
    assert [(r["sample_id"], r["image_id"], r["image_path"], r["caption"], r["split"])
            for r in rows] == [
        ("captions-00000001", "captions-00000001", None, "A red cube left of a blue ball.", "train"),
        ("captions-00000002", "captions-00000002", None, "", "train"),  # rejected downstream
        ("captions-00000003", "captions-00000003", None, "Two dogs on a bench.", "train")]
    with pytest.raises(DataError, match="names no images"):
        caption_table(_input(uri=str(path), image_root="/images"))


def test_the_input_format_follows_the_file_name_then_its_content(tmp_path):
    from csclip.extract.captions import resolve_format

    karpathy = {"images": [{"filename": "a.jpg", "split": "val", "cocoid": 1,
                            "sentences": [{"sentid": 7, "raw": "A cat."}]}]}
    coco = {"images": [{"id": 1, "file_name": "a.jpg"}],
            "annotations": [{"image_id": 1, "id": 2, "caption": "A cat."}]}
    files = {"c.txt": "a cat\n", "c.csv": "", "c.TSV": "", "c.jsonl": "",
             "dataset_flickr30k.json": "{}", "captions_val2014.json": "{}",
             "mine.json": json.dumps(karpathy), "theirs.json": json.dumps(coco)}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    formats = {name: resolve_format(_input(uri=str(tmp_path / name))).format for name in files}
    assert formats == {"c.txt": "txt", "c.csv": "csv", "c.TSV": "csv", "c.jsonl": "jsonl",
                       "dataset_flickr30k.json": "karpathy", "captions_val2014.json": "coco",
                       "mine.json": "karpathy", "theirs.json": "coco"}
    assert resolve_format(_input()).format == "world"
    assert resolve_format(_input(format="jsonl", uri=str(tmp_path / "c.txt"))).format == "jsonl"
    for name, message in (("c.md", "suffix '.md' names no caption format"),
                          ("", "is a directory")):
        (tmp_path / "c.md").write_text("a cat\n")
        with pytest.raises(DataError, match=message):
            resolve_format(_input(uri=str(tmp_path / name)))


def test_a_file_with_format_world_is_refused():
    from csclip.config.extract import ExtractConfig

    with pytest.raises(ConfigError, match="input.format=world generates its captions"):
        load_config(ExtractConfig, None, ["input.format=world", "input.uri=c.txt"])


def test_csv_columns_and_separator_are_open_clip_trains(tmp_path):
    from csclip.config.extract import ExtractConfig
    from csclip.entry import extract
    from csclip.extract.captions import caption_table

    (tmp_path / "train.csv").write_text("filepath\ttitle\nimgs/a.jpg\tA dog, brown.\n")
    rows = caption_table(_input(uri=str(tmp_path / "train.csv"))).to_pylist()
    assert [(r["image_path"], r["caption"]) for r in rows] == [("imgs/a.jpg", "A dog, brown.")]

    (tmp_path / "pairs.csv").write_text("path,text\nb.jpg,\"A cat, grey.\"\n")
    with pytest.raises(DataError, match=r"no column 'filepath' \(--csv-img-key\).*--csv-separator"):
        caption_table(_input(uri=str(tmp_path / "pairs.csv")))
    args = extract.build_parser().parse_args([
        "--backend", "rules", "--input", str(tmp_path / "pairs.csv"), "--csv-img-key", "path",
        "--csv-caption-key", "text", "--csv-separator", ","])
    config = load_config(ExtractConfig, None, extract.overrides_from_args(args))
    rows = caption_table(config.input).to_pylist()
    assert [(r["image_path"], r["caption"]) for r in rows] == [("b.jpg", "A cat, grey.")]
    # "\t" as a shell passes it (a backslash and a t) is a tab, as in open_clip_train.
    assert _input(csv_separator="\\t").csv_separator == "\t"


def test_an_unknown_suffix_is_one_line_before_ray(tmp_path, monkeypatch, capsys):
    import csclip.entry.ray_init
    from csclip.entry import extract

    def refuse(*args, **kwargs):
        raise AssertionError("Ray started: the input was not refused")

    monkeypatch.setattr(csclip.entry.ray_init, "init_ray", refuse)
    (tmp_path / "captions.md").write_text("A cat.\n")
    code = extract.main(["--backend", "rules", "--input", str(tmp_path / "captions.md"),
                         "--out", str(tmp_path / "out"), "--no-tracking"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "captions.md" in err, err


def test_no_tracking_extraction_logs_no_run(ray_session, tmp_path, monkeypatch, capsys):
    """The one Ray run of this module: `--input captions.txt --no-tracking` extracts the
    file's three captions and creates no MLflow store."""
    from csclip.entry import extract
    from csclip.units import read_units

    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "captions.txt").write_text(
        "A red cube left of a blue ball.\nA small green cube.\nA yellow ball above a red cube.\n")
    code = extract.main(["--backend", "rules", "--input", "captions.txt", "--out", "out",
                         "--no-tracking"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "read 3 = " in out and "MLflow run" not in out
    assert not store.exists() and not (tmp_path / "mlruns").exists()
    assert {r.sample_id for r in read_units(str(tmp_path / "out" / "units"))} <= {
        f"captions-0000000{n}" for n in (1, 2, 3)}


def test_no_tracking_is_a_flag_of_every_command():
    from csclip.config.extract import ExtractConfig
    from csclip.entry import demo, evaluate, extract, train

    for module, field in ((train, "tracking.enabled"), (evaluate, "tracking.enabled"),
                          (extract, "tracking.enabled"), (demo, "train.tracking.enabled")):
        args = module.build_parser().parse_args(["--no-tracking"])
        assert args.overrides[-1] == f"{field}=false", module.__name__
    args = extract.build_parser().parse_args(["--no-tracking"])
    assert not load_config(ExtractConfig, None, extract.overrides_from_args(args)).tracking.enabled
    assert "tracking.uri=null" not in extract.DESCRIPTION


# `tracking.uri: null` is the default store ($MLFLOW_TRACKING_URI, else ./mlflow.db), never
# an off switch: no help text or doc may say it turns tracking off.
NULL_URI = re.compile(r"tracking\.uri\s*[=:]\s*(null|none|~|''|\"\")", re.IGNORECASE)


def test_no_help_text_or_doc_offers_tracking_uri_null_as_an_off_switch():
    from csclip import cli
    from csclip.entry import ablate, benchmark, demo, evaluate, extract, train

    texts = {f"csclip {m.__name__.rsplit('.', 1)[-1]} --help": m.build_parser().format_help()
             for m in (ablate, benchmark, demo, evaluate, extract, train)}
    texts["csclip --help"] = cli.usage()
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
                 *sorted((REPO / "configs").glob("*.yaml"))]:
        texts[str(path.relative_to(REPO))] = path.read_text()
    claims = [f"{where}: {match.group(0)}" for where, text in texts.items()
              for match in NULL_URI.finditer(text)]
    assert not claims, claims
    assert len(texts) > 10  # the helps, the README and the docs were read
    # What the help does name as the switch.
    for name in ("ablate", "demo", "evaluate", "extract", "train"):
        assert "--no-tracking" in texts[f"csclip {name} --help"], name


def test_tracking_uri_null_logs_to_the_resolved_store_and_names_it(ray_session, tmp_path,
                                                                    monkeypatch, capsys):
    """`csclip extract --set tracking.uri=null`: the run is logged (null is the default
    store, ./mlflow.db here) and the last line names that store, never 'None'."""
    from mlflow.tracking import MlflowClient
    from mlflow_store import fresh_store

    from csclip.entry import extract

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    store = fresh_store(tmp_path / "mlflow.db")
    (tmp_path / "captions.txt").write_text("A red cube left of a blue ball.\nA green cube.\n")
    code = extract.main(["--backend", "rules", "--input", "captions.txt", "--out", "out",
                         "--set", "tracking.uri=null"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0, last
    assert "None" not in last and last.startswith("MLflow run "), last
    assert last.endswith(f"--backend-store-uri sqlite:///{store}"), last
    run_id = last.split()[2]
    run = MlflowClient(f"sqlite:///{store}").get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["read"] == 2


def test_the_mlflow_line_names_the_resolved_store(monkeypatch, tmp_path):
    from csclip.config.tracking import TrackingConfig
    from csclip.entry.common import mlflow_line

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert mlflow_line("abc", TrackingConfig(uri=None)).endswith(
        "--backend-store-uri http://tracking.example:5000")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    assert mlflow_line("abc", TrackingConfig(uri=None)).endswith(
        f"--backend-store-uri sqlite:///{tmp_path / 'mlflow.db'}")


def test_version_is_the_installed_packages(capsys):
    from csclip import cli

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"csclip {importlib.metadata.version('csclip')}"


# The command, a typo in one of its settings and the line it must print.
TYPOS = [
    (["train", "--set", "optim.lrr=1"], "unknown setting optim.lrr (did you mean optim.lr?)"),
    (["demo", "--set", "train.optim.lrr=1"],
     "unknown setting train.optim.lrr (did you mean train.optim.lr?)"),
    (["extract", "--set", "input.formt=txt"],
     "unknown setting input.formt (did you mean input.format?)"),
]


def _run_cli_reporting_torch(argv: list[str]) -> subprocess.CompletedProcess:
    """`csclip <argv>` in a fresh interpreter that prints, after main returns, whether
    torch was imported."""
    code = ("import sys\nfrom csclip.cli import main\ncode = main(sys.argv[1:])\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch')\nsys.exit(code)")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize(("argv", "line"), TYPOS, ids=[t[0][0] for t in TYPOS])
def test_a_typo_is_refused_with_its_near_miss_before_torch_is_imported(argv, line):
    done = _run_cli_reporting_torch(argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(line), done.stderr
    assert done.stdout.strip() == "no torch"


# The command, a value out of its field's range, and what its one line names.
BAD_VALUES = [
    (["train", "--set", "optim.warmup_steps=-3"], "optim.warmup_steps"),
    (["evaluate", "--set", "benchmark.num_bootstrap=-1"], "benchmark.num_bootstrap"),
    (["extract", "--set", "output.shard_size=0"], "output.shard_size"),
]


@pytest.mark.parametrize(("argv", "field"), BAD_VALUES, ids=[v[0][0] for v in BAD_VALUES])
def test_a_bad_value_is_refused_in_one_line_before_torch_is_imported(argv, field):
    done = _run_cli_reporting_torch(argv)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], lines
    assert done.stdout.strip() == "no torch"


def test_unknown_yaml_keys_get_their_near_miss_and_renamed_keys_their_replacement(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("input:\n  uri: c.txt\noutput:\n  shard_sise: 10\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown setting output\.shard_sise "
                                          r"\(did you mean output\.shard_size\?\)"):
        load_config(ExtractConfig, path)
    # An old field name gets the line that names its replacement.
    with pytest.raises(ConfigError, match=r"model\.lock\.image"):
        load_config(TrainConfig, None, ["model.lock_image=true"])


