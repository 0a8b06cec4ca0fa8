"""The commands users were promised, exactly as they type them, against a local Ray head
and MLflow server started as cluster.yaml starts them: `ray start --head` with token
authentication (RAY_AUTH_MODE=token, the token in a file named by RAY_AUTH_TOKEN_PATH,
the dashboard on 127.0.0.1) and `mlflow server` behind MLflow's basic-auth app, the
credentials and the tracking URI in every Ray process's environment. A job submitted
without the token, or with a wrong one, is refused; anonymous clients of the tracking
server are refused. With the token, the paper's walk-through runs: every command of
docs/cluster.md's "The run, stage by stage", read from the doc, in its order (extraction,
paper.yaml's training of CS-CLIP and CLIP-FT, the evaluations with --select paper and the
paper's suites, the pretrained and NegCLIP rows, the `--grid paper` sweep and
`report --paper`), on a small COCO-shaped fixture with csclip-tiny. What cannot run on
CPU is replaced as REHEARSAL_CHANGES says, and each replacement must still match the doc;
the runs land in the tracking server, not in the job's temporary working directory."""

from __future__ import annotations

import base64
import csv
import json
import re
import secrets
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import cluster_harness as harness
import pyarrow.parquet as pq
import pytest
from paper_fixtures import write_flickr8k, write_zeroshot_paper
from swap_negatives_helpers import tagged_pipeline, untrained_punkt
from test_quickstart import parse_blocks
from walkthrough_fixtures import (
    complete_suites,
    write_coco_karpathy,
    write_negclip_checkpoint,
)

from csclip.config.world import PALETTE, SHAPES, SIZES
from csclip.eval.report import EVALUATION_COMPLETE
from csclip.units import SWAP_NEGATIVES_META

CLUSTER_DOC = harness.REPO_ROOT / "docs" / "cluster.md"
WALKTHROUGH = ("## The run, stage by stage", "## Time and cost")
# The walk-through's commands that set up AWS rather than run csclip, and what the
# rehearsal does in their place.
CLUSTER_ONLY: dict[str, str] = {
    "pip install ": "this venv",
    "ray up ": "a local head started as cluster.yaml starts it",
    "ray dashboard ": "the head's dashboard on 127.0.0.1",
    "ray rsync-down ": "the token file this test writes",
    "export ": "the same variables in every command's environment",
    "aws s3 ": "the fixtures, written into a local folder that stands for the bucket",
    "ray rsync-up ": "a NegCLIP-format file of csclip-tiny in the head's home folder",
    "ray down ": "the head stopped at the end",
    "ray exec ": "a stand-in spaCy pipeline and NLTK Punkt tables this test writes "
                 "(en_core_web_sm cannot be downloaded here: tests/swap_negatives_helpers.py)",
}
SUITES = "paper,zeroshot_paper,coco_retrieval,flickr8k_retrieval"
# What the rehearsal changes in the doc's commands: (the doc's text, the rehearsal's).
# Every one must occur in the walk-through (a doc that drops one fails the test, so this
# table is kept with the doc).
REHEARSAL_CHANGES: tuple[tuple[str, str], ...] = (
    # The LLM stage: the rules backend on CPU (the authors' prompt set on the real engine
    # is tests/test_vllm_engine.py's; their outputs, tests/test_authors_extraction.py's).
    ("--prompts authors --out-format authors", "--set backend.name=rules"),
    # The authors' caption shuffles on a stand-in tagger (shapes as nouns, colours and
    # sizes as adjectives) and untrained Punkt tables: the stage runs whole, on CPU.
    ("--set swap_negatives.enabled=true",
     "--set swap_negatives.enabled=true --set swap_negatives.spacy_model=<spacy-standin>"),
    # The jobs one after another on two cores.
    (" --no-wait", ""),
    # OpenAI's weights cannot be downloaded here: csclip-tiny, random weights.
    ("--model ViT-B-32 --pretrained openai", "--model csclip-tiny --set model.image_size=32"),
    ("--model ViT-B-32 --pretrained", "--set model.image_size=32 --model csclip-tiny --pretrained"),
    # One of the authors' rows (a sweep of one trial, for time): the swap row with their
    # ranking loss. tests/test_ablation.py runs sweeps of two trials and their resume.
    ("--grid paper ", "--grid paper=swapfrac-0.5 "),
    # The CLIP row is csclip-tiny with random weights here, which no rule can tell is the
    # paper's CLIP (ViT-B-32 with the tag openai is): --label says so.
    ("--out /home/ray/report", "--label /home/ray/eval/clip=CLIP --out /home/ray/report"),
)
# Tiny settings per entry point, after the doc's own flags.
TINY_TRAIN = ["model.name=csclip-tiny", "model.pretrained=null", "model.quick_gelu=null",
              "model.image_size=32", "data.batch_size=8", "data.val_ratio=0.1",
              "optim.max_steps=4", "run.checkpoint_every=4", "run.eval_every=2",
              "run.num_workers=1", "run.cpus_per_worker=1", "run.worker_resources={}",
              "run.use_gpu=false", "run.precision=fp32", "run.log_every=1"]
TINY_EVAL = ["benchmark.num_bootstrap=10"]
TINY: dict[str, list[str]] = {
    "pipelines/extract_units.py": ["output.shard_size=100"],
    "pipelines/train.py": TINY_TRAIN,
    "pipelines/evaluate.py": TINY_EVAL,
    "tune/ablate.py": TINY_TRAIN,
    "pipelines/report.py": [],
}


def walkthrough_commands(text: str) -> list[str]:
    """The commands of the walk-through's ```bash blocks, in order, each `for X in a b;
    do ... done` loop written out once per value."""
    section = text[text.index(WALKTHROUGH[0]):text.index(WALKTHROUGH[1])]
    commands = [c.text for block in parse_blocks(section) for c in block.commands]
    out: list[str] = []
    i = 0
    while i < len(commands):
        loop = re.fullmatch(r"for (\w+) in ([^;]+); do", commands[i])
        if loop is None:
            out.append(commands[i])
            i += 1
            continue
        end = commands.index("done", i)
        for value in loop.group(2).split():
            out += [c.replace(f"${loop.group(1)}", value) for c in commands[i + 1:end]]
        i = end + 1
    return out


def rehearsal_command(command: str, places: dict[str, str], used: set[str]) -> str:
    """The doc's command as the rehearsal runs it: REHEARSAL_CHANGES applied (each one
    recorded in `used`), the bucket, the head's home and the run names put in (`places`),
    and the entry point's tiny settings appended."""
    for doc, here in REHEARSAL_CHANGES:
        if doc in command:
            command = command.replace(doc, here)
            used.add(doc)
    for doc, here in places.items():
        command = command.replace(doc, here)
    [entry] = [e for e in TINY if f" {e} " in f"{command} "]
    return f"{command} {' '.join(shlex.quote(t) for t in _sets(TINY[entry]))}"


def test_the_walkthrough_is_read_whole_from_the_doc():
    """Every command of the walk-through is either one the rehearsal runs (an entry point
    with tiny settings) or a cluster-only one it stands in for; every change the rehearsal
    makes still matches the doc."""
    commands = walkthrough_commands(CLUSTER_DOC.read_text())
    run = [c for c in commands if not c.startswith(tuple(CLUSTER_ONLY))]
    assert all(c.startswith("ray job submit --") for c in run), run
    used: set[str] = set()
    rehearsed = [rehearsal_command(c, {}, used) for c in run]
    assert used == {doc for doc, _ in REHEARSAL_CHANGES}
    entries = [next(e for e in TINY if f" {e} " in c) for c in rehearsed]
    assert entries == ["pipelines/extract_units.py", "pipelines/train.py", "pipelines/train.py",
                       *["pipelines/evaluate.py"] * 4, "tune/ablate.py", "pipelines/report.py"]
    # Each stand-in is for a command the doc has.
    assert all(any(c.startswith(k) for c in commands) for k in CLUSTER_ONLY)
    assert all(f"--suite {SUITES}" in c for c in run if "evaluate.py" in c or "ablate.py" in c)


def _sets(overrides: list[str]) -> list[str]:
    return [token for override in overrides for token in ("--set", override)]


def _run(command: list[str], env: dict, log, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a user command from the project root, its output kept in the test's log."""
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    started = time.monotonic()
    done = subprocess.run(command, cwd=harness.REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    log.write(f"{done.stdout}\n[exit {done.returncode} after {time.monotonic() - started:.0f} s]\n")
    log.flush()
    return done


def _post_job(head: dict, headers: dict[str, str]) -> int:
    """The job API itself, as any host that reached the port would call it."""
    request = urllib.request.Request(
        f"{head['dashboard']}/api/jobs/", method="POST",
        data=json.dumps({"entrypoint": "echo never-run"}).encode(),
        headers={"Content-Type": "application/json", **headers})
    return _status(request)


def _status(request: urllib.request.Request | str) -> int:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _submit_marker(head: dict, env: dict, log, marker: str) -> subprocess.CompletedProcess:
    return _run(["ray", "job", "submit", "--address", head["dashboard"], "--",
                 "python", "-c", f"print('{marker}')"], env, log, timeout=180)


@pytest.mark.slow
def test_the_walkthrough_against_a_real_ray_head(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    ray_tmp = harness.short_tmpdir("csclip-head-")
    token = tmp_path / "ray-token"  # as head_setup_commands makes it
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    password = secrets.token_hex(32)  # the jobs' (mlflow-jobs-password)
    admin_password = tmp_path / "admin-password"  # the head's own
    admin_password.write_text(secrets.token_hex(32))
    # As cluster.yaml exports them before every `ray start`: every driver, Train worker,
    # Tune trial and Data task inherits the token and MLflow's credentials, the jobs' user's
    # (made by cluster/mlflow_jobs_user.py below), not the admin's.
    cluster_vars = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "MLFLOW_TRACKING_USERNAME": "csclip-jobs",
                    "MLFLOW_TRACKING_PASSWORD": password}
    # Without the venv's bin first on PATH the job's `python` is the system one.
    env = harness.isolated_env(ray_tmp, CSCLIP_CACHE_DIR=str(tmp_path / "cache"),
                               **cluster_vars)
    # What the walk-through's `ray exec` installs on the head, as stand-ins.
    env["NLTK_DATA"] = str(untrained_punkt(tmp_path / "nltk_data"))
    standin = tmp_path / "spacy-standin"
    tagged_pipeline({"NOUN": list(SHAPES), "ADJ": [*PALETTE, *SIZES]}).to_disk(standin)
    env.pop("MLFLOW_TRACKING_URI", None)
    # Clients that know nothing of the token, or have a wrong one.
    without = {k: v for k, v in env.items() if k not in cluster_vars}
    without["RAY_AUTH_MODE"] = "disabled"
    wrong = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    wrong.pop("RAY_AUTH_TOKEN_PATH")
    project_stores = _local_stores()
    mlflow, mlflow_uri = harness.mlflow_server(tmp_path / "mlflow", without,
                                               admin_password=admin_password.read_text())
    env["MLFLOW_TRACKING_URI"] = mlflow_uri  # as cluster.yaml exports it on every node
    # With token authentication on, only the health checks answer without the token.
    ray_head, head = harness.ray_head(ray_tmp, env, ready_path="/api/gcs_healthz")
    env["RAY_ADDRESS"] = head["dashboard"]  # the walk-through's `export RAY_ADDRESS=...`
    started = time.monotonic()
    with (tmp_path / "commands.log").open("w") as log, harness.running(ray_head, mlflow):
        log.write(f"[head and MLflow server ready after {time.monotonic() - started:.0f} s]\n")
        # As head_start_ray_commands does once the server runs: the jobs' user, no admin.
        (tmp_path / "jobs-password").write_text(password)
        (tmp_path / "server.pid").write_text(str(mlflow.process.pid))
        jobs_user = _run(["python", str(harness.REPO_ROOT / "cluster" / "mlflow_jobs_user.py"),
                          mlflow_uri, str(admin_password), str(tmp_path / "jobs-password"),
                          str(tmp_path / "server.pid")], without, log, timeout=120)
        assert jobs_user.returncode == 0 and "csclip-jobs: created" in jobs_user.stdout
        assert _status(urllib.request.Request(
            f"{mlflow_uri}/api/2.0/mlflow/users/create", method="POST",
            data=json.dumps({"username": "mallory", "password": "x"}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Basic " +
                     base64.b64encode(f"csclip-jobs:{password}".encode()).decode()})) == 403
        with urllib.request.urlopen(f"{head['dashboard']}/api/authentication_mode") as answer:
            assert json.loads(answer.read())["authentication_mode"] == "token"
        assert _post_job(head, {}) == 401
        assert _post_job(head, {"Authorization": f"Bearer {secrets.token_hex(32)}"}) == 403
        refused = _submit_marker(head, without, log, "no-token-ran")
        assert refused.returncode != 0 and "no-token-ran" not in refused.stdout
        assert "Unauthorized: Missing authentication token" in refused.stdout
        refused = _submit_marker(head, wrong, log, "wrong-token-ran")
        assert refused.returncode != 0 and "wrong-token-ran" not in refused.stdout
        assert "Forbidden: Invalid authentication token" in refused.stdout
        # The tracking server: nothing for anonymous clients or a wrong password.
        search = f"{mlflow_uri}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(search) == 401
        assert _status(urllib.request.Request(search, headers={
            "Authorization": "Basic " + base64.b64encode(b"csclip:wrong").decode()})) == 401

        # The walk-through, command by command, as docs/cluster.md gives it.
        bucket, home = tmp_path / "bucket", tmp_path / "home"
        write_coco_karpathy(bucket / "coco")                          # aws s3 cp / sync
        shutil.copytree(harness.REPO_ROOT / "tests" / "fixtures" / "suites", bucket / "bench",
                        ignore=shutil.ignore_patterns("*.py", "published"))
        write_zeroshot_paper(bucket / "bench")
        write_flickr8k(bucket / "bench")
        complete_suites(bucket / "bench", tuple(SUITES.split(",")))
        write_negclip_checkpoint(home / "negclip.pth")                # ray rsync-up
        places = {"s3://MY-BUCKET": str(bucket), "/home/ray": str(home),
                  "<spacy-standin>": str(standin)}
        used: set[str] = set()
        outputs: dict[str, str] = {}
        for command in walkthrough_commands(CLUSTER_DOC.read_text()):
            if command.startswith(tuple(CLUSTER_ONLY)):
                log.write(f"\n[not rehearsed: {command}]\n")
                continue
            command = rehearsal_command(command, places, used)
            done = harness.submit_until_accepted(
                lambda c=command: _run(["bash", "-c", c], env, log, timeout=600))
            assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}"
            assert "succeeded" in done.stdout, done.stdout[-2000:]
            outputs[command] = done.stdout
            for line in done.stdout.splitlines():  # the names later commands take
                if "final checkpoint" in line:
                    run = line.rsplit("/", 2)[-2]
                    places[f"<{run.split('-')[0]}-run>"] = run
                if sweep := re.match(r"sweep (\S+): .*; report in (\S+);", line):
                    places["<sweep>"] = sweep.group(1)
                    assert sweep.group(2) == f"{bucket}/runs/tune/{sweep.group(1)}-report"
        assert used == {doc for doc, _ in REHEARSAL_CHANGES}
        # The extraction wrote the authors' caption shuffles, which paper.yaml trains on.
        units = pq.read_table(bucket / "units" / "coco-qwen3-8b" / "units").to_pylist()
        shuffled = [r for r in units if any(k == SWAP_NEGATIVES_META for k, _ in r["meta"] or ())]
        assert len(shuffled) >= len(units) // 2, (len(shuffled), len(units))
        assert set(places) >= {"<csclip-run>", "<clip-run>", "<sweep>"}
        for run in (places["<csclip-run>"], places["<clip-run>"]):
            checkpoint = bucket / "runs" / "train" / run
            assert (checkpoint / "final" / "model.pt").is_file()  # where the config said
            assert (checkpoint / "best" / "model.pt").is_file()   # the held-out rule's
            selection = (home / "eval" / run / "selection.csv").read_text()
            assert "step" in selection and (home / "eval" / run / EVALUATION_COMPLETE).is_file()
        check_paper_report(home / "report", places)

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "csclip-jobs")  # this process reads too
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
        client = MlflowClient(mlflow_uri)
        train_runs = [r for r in _search(client, "csclip-paper")  # not the sweep's trials
                      if r.data.tags.get("checkpoint_uri")
                      and "mlflow.parentRunId" not in r.data.tags]
        assert sorted(r.data.tags["checkpoint_uri"].rsplit("/", 2)[-2] for r in train_runs) \
            == sorted([places["<csclip-run>"], places["<clip-run>"]])
        assert all(r.info.status == "FINISHED" and r.data.metrics["step"] == 4
                   for r in train_runs)
        eval_runs = _search(client, "csclip-eval")
        assert len(eval_runs) >= 4 and all("ht_all" in r.data.metrics for r in eval_runs)
        sweep_runs = _search(client, "csclip-paper-ablate") if _has(client, "csclip-paper-ablate") \
            else [r for r in _search(client, "csclip-paper") if r.data.tags.get("csclip_role")]
        [parent] = [r for r in sweep_runs if r.data.tags.get("csclip_role") == "sweep"]
        children = [r for r in sweep_runs if r.data.tags.get("csclip_role") == "trial"]
        assert len(children) == 1
        assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
        assert all(r.info.status == "FINISHED" and "ht_all" in r.data.metrics for r in children)
        parent_artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
        assert {"ablation.md", "ablation.csv", "ablation.png"} <= parent_artifacts
        [report_run] = _search(client, "csclip-report")
        assert {"table1.png", "table16.csv", "paper_report.md"} <= {
            a.path for a in client.list_artifacts(report_run.info.run_id)}
        # Nothing was written into the job's unpacked working directory under the session.
        leftovers = [str(p) for p in ray_tmp.rglob("mlflow.db")] + \
            [str(p) for p in ray_tmp.rglob("mlruns")] + [str(p) for p in ray_tmp.rglob("runs")]
        assert leftovers == []
        stopping = time.monotonic()
    with (tmp_path / "commands.log").open("a") as log:
        log.write(f"[head and MLflow server stopped after {time.monotonic() - stopping:.0f} s]\n")
    assert _local_stores() == project_stores  # no store created or written in the project
    shutil.rmtree(ray_tmp, ignore_errors=True)  # the head's session files (on success only)


def check_paper_report(report: Path, places: dict[str, str]) -> None:
    """The five tables, each as markdown, CSV and PNG, with the rehearsal's models in the
    paper's rows beside the paper's numbers."""
    names = {p.name for p in report.iterdir()}
    for stem in ("table1", "table6", "table7", "table16", "table17"):
        assert {f"{stem}.md", f"{stem}.csv", f"{stem}.png"} <= names, sorted(names)
    assert "paper_report.md" in names
    # Each evaluation matched to its row (the CLIP row by --label, the NegCLIP file by its
    # name, the two trainings by their run folders), every column of ours filled.
    models = ("CLIP", "CLIP-FT", "NegCLIP", "CS-CLIP")
    for stem in ("table1", "table6", "table7"):
        rows = {r["paper_row"]: r for r in _csv(report / f"{stem}.csv") if r["paper_row"]}
        assert set(models) <= set(rows), (stem, sorted(rows))
        for row in models:
            assert _empty_cells(rows[row]) == [], (stem, row)
    table1 = {r["paper_row"]: r for r in _csv(report / "table1.csv")}
    for row in models:
        ours, paper = float(table1[row]["ht_all"]), float(table1[row]["ht_all_paper"])
        assert float(table1[row]["ht_all_diff"]) == pytest.approx(ours - paper, abs=1e-6)
    assert places["<csclip-run>"] in table1["CS-CLIP"]["pretrained"]
    assert places["<clip-run>"] in table1["CLIP-FT"]["pretrained"]
    # The sweep's row is the paper's swap row, every column measured (the paper's ZS and
    # Retr columns included) beside the paper's number.
    swaps = {r["paper_row"]: r for r in _csv(report / "table16.csv")
             if r["paper_row"].startswith("swapfrac-") and r["ht_all"]}
    assert set(swaps) == {"swapfrac-0.5"}, swaps
    assert all(_empty_cells(r) == [] for r in swaps.values())


def _empty_cells(row: dict[str, str]) -> list[str]:
    """The columns of a report row (each `<key>` with a `<key>_paper` beside it) that
    have no number of ours."""
    return [key for key in row if f"{key}_paper" in row and not row[key]]


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _has(client, experiment: str) -> bool:
    return client.get_experiment_by_name(experiment) is not None


def _local_stores() -> dict[str, int]:
    """The default local tracking stores in the project directory, with their mtimes."""
    return {p.name: p.stat().st_mtime_ns for p in (harness.REPO_ROOT / "mlflow.db",
                                                    harness.REPO_ROOT / "mlruns") if p.exists()}


def _search(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} on the server"
    return client.search_runs([found.experiment_id])

