"""LLM-extraction CPU cost and token budget: how fast the answer stage (parse,
schema check, SPEC §2 validation) and the prompt stage run per core, against a
json.loads-only baseline in the same run, and the prompt/answer token counts behind the
captions/s-per-GPU estimate in docs/performance.md.

    .venv/bin/python benchmarks/bench_extract.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_extract_pipeline import GOOD  # noqa: E402  (hand-written answers, real captions)

from csclip.config.extract import InputConfig, VllmConfig  # noqa: E402
from csclip.extract import prompts  # noqa: E402
from csclip.extract.captions import caption_table  # noqa: E402
from csclip.extract.prompt_sets.csclip import answer_stage  # noqa: E402
from csclip.extract.vllm import add_prompt_columns  # noqa: E402

SUGARCREPE = ROOT.parent / "shared" / "data" / "sugarcrepe"


def answer_rows(repeat: int) -> pa.Table:
    rows = []
    for i in range(repeat):
        for j, (caption, answer) in enumerate(GOOD.items()):
            rows.append({"sample_id": f"s-{i}-{j}", "shard": 0, "image_id": "x", "caption": caption,
                         "split": "train", "image_path": None, "image_bytes": None,
                         "generated_text": json.dumps(answer), "__inference_error__": ""})
    return pa.Table.from_pylist(rows)


def cpu_stages(repeat: int) -> dict[str, float]:
    batch = answer_rows(repeat)
    texts = batch.column("generated_text").to_pylist()
    start = time.perf_counter()
    for text in texts:
        json.loads(text)
    baseline = time.perf_counter() - start
    start = time.perf_counter()
    out = answer_stage(batch, attempt=0, repair=True)
    answers = time.perf_counter() - start
    assert set(out.column("status").to_pylist()) == {"ok"}
    captions = batch.select(["sample_id", "shard", "image_id", "caption", "split", "image_path"])
    start = time.perf_counter()
    add_prompt_columns(captions, cfg_json=VllmConfig().model_dump_json())
    prompt = time.perf_counter() - start
    n = batch.num_rows
    return {"rows": n, "json_loads_rows_per_s": n / baseline, "answer_stage_rows_per_s": n / answers,
            "answer_stage_vs_json_loads": answers / baseline, "prompt_stage_rows_per_s": n / prompt}


def token_counts() -> dict[str, float]:
    # open_clip's BPE (CLIP vocabulary, offline) as a proxy for Qwen's tokenizer; chars/4 as
    # a second estimate. Both are proxies: the estimate in docs states the spread.
    from open_clip.tokenizer import SimpleTokenizer

    tok = SimpleTokenizer()
    captions = caption_table(InputConfig(format="sugarcrepe", uri=str(SUGARCREPE))).column("caption").to_pylist()
    user = [len(tok.encode(prompts.user_prompt(c))) for c in captions]
    answers = [json.dumps(a) for a in GOOD.values()]
    return {"system_prompt_bpe": len(tok.encode(prompts.SYSTEM_PROMPT)),
            "system_prompt_chars_div4": len(prompts.SYSTEM_PROMPT) / 4,
            "user_prompt_bpe_mean": statistics.mean(user),
            "answer_bpe_mean": statistics.mean(len(tok.encode(a)) for a in answers),
            "answer_chars_div4_mean": statistics.mean(len(a) / 4 for a in answers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    for name, values in (("cpu stages", cpu_stages(args.repeat)), ("tokens", token_counts())):
        print(f"{name}:")
        for key, value in values.items():
            print(f"  {key:28s} {value:10.1f}" if isinstance(value, float) else f"  {key:28s} {value:10d}")


if __name__ == "__main__":
    main()
