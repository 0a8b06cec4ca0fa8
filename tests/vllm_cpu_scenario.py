"""Runs inside .venv-vllm (the real vLLM engine, CPU build): tiny models made here, and the
scenarios tests/test_vllm_engine.py drives through subprocesses.

    python tests/vllm_cpu_scenario.py model DIR [--answer good|control]
    python tests/vllm_cpu_scenario.py extract CAPTIONS OUT [--set key=value ...]
        [--stages MODEL_DIR REPORT] [--authors-out OUT2]

`extract --stages` first writes the stages report (the ray remote args of each stage our
config builds for MODEL_DIR), in the Ray instance the extraction then runs in: building a
processor starts a Ray instance when none is up (ray.data.llm's telemetry actor), which
costs ~20 CPU-s on a 2-core machine.

The model is a 2-layer Qwen3 whose output ignores its input: every hidden state is the
same vector, so the logits are a fixed ranking of the vocabulary (a "unigram" model). Its
byte-level BPE tokenizer, trained here, holds each canned answer as ONE token, so the
model's favourite token is a whole answer, and the structured-outputs grammar decides
whether that token may be emitted. `good` ranks a schema-valid answer first, then EOS.
`control` ranks first the same answer with a raw tab inside a string (valid for a grammar
that admits control characters, invalid JSON), then the good answer: a backend that only
lets through parseable JSON answers `good`, a looser one answers invalid JSON.

`control` also serves the authors' prompt set (`--authors-out`: the same captions with
`--prompts authors`, in the same Ray instance): above those two it ranks an entity-foil
answer and a relation-foil answer, and below them an extraction answer, so each of the
three calls gets the answer its own schema admits (guidance allows properties a schema does
not name, as JSON Schema does: the entity-foil answer carries `"relation_negatives": 0`,
which the relation-foil schema refuses; neither has the extraction's required keys, and
csclip's schema refuses all three).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# The one answer of the model, for captions that mention a dog: entity "dog" with two foils.
GOOD_ANSWER = ('{"entities": [{"entity": "dog", "foils": [{"foil": "cat", "change_type": '
               '"object_change"}, {"foil": "black dog", "change_type": "attribute_change"}]}], '
               '"relations": []}')
# The same with a raw tab in the entity string: json.loads refuses it.
CONTROL_ANSWER = GOOD_ANSWER.replace('"dog", "foils"', '"dog\t", "foils"', 1)
# The authors' three calls (csclip.extract.authors_prompts), for every caption.
AUTHORS_EXTRACT = ('{"entities": ["dog", "grass"], "relations": [{"subject": "dog", '
                   '"relation_type": "is on", "object": "grass"}]}')
AUTHORS_ENTITY_FOILS = ('{"negative_variants": [{"negative": "cat", "change_type": '
                        '"object_change"}, {"negative": "black dog", "change_type": '
                        '"attribute_change"}], "relation_negatives": 0}')
AUTHORS_RELATION_FOILS = ('{"relation_negatives": [{"original_relation": "is on", '
                          '"original_subject": "dog", "original_object": "grass", "negatives": '
                          '[{"relation_type": "is under", "change_type": "antonym"}, '
                          '{"swap_subject": "grass", "swap_object": "dog", "change_type": "swap"}]}]}')
ANSWERS = {"good": GOOD_ANSWER, "control": CONTROL_ANSWER, "authors_extract": AUTHORS_EXTRACT,
           "authors_entity": AUTHORS_ENTITY_FOILS, "authors_relation": AUTHORS_RELATION_FOILS}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style, and strict about thinking: a prompt rendered without enable_thinking=False
# fails the row, so every answer that comes back proves the switch reached the template.
CHAT_TEMPLATE = (
    "{%- if enable_thinking is not defined or enable_thinking %}"
    "{{ raise_exception('this model runs with enable_thinking=False only') }}{%- endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)


def _corpus() -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from csclip.extract.authors_prompts import SYSTEM as AUTHORS_SYSTEM
    from csclip.extract.prompts import SYSTEM_PROMPT

    words = ("a dog runs on the grass near a red car while two people walk by the "
             "river and a cat sleeps under a wooden table in the kitchen").split()
    # The authors' system prompts often enough that they tokenize short (their calls have
    # 800 / 400 / 800 max_tokens within the test's max_model_len).
    return ([SYSTEM_PROMPT, "That answer was rejected: Write the corrected JSON for the same "
             "caption, following every rule above.", "Caption: \"\"\nAnswer:"]
            + list(AUTHORS_SYSTEM.values()) * 20
            + [" ".join(words[i:i + 6]) for i in range(len(words))] * 5
            + [answer for answer in ANSWERS.values() for _ in range(300)])


def make_model(directory: Path, answer: str = "good") -> Path:
    """Write the tiny model (config, safetensors weights, tokenizer, chat template)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    # No regex split: merges may span spaces and quotes, so a whole answer is one token.
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    # max_token_length: the answers (< 300 bytes) are one token each, the system prompts
    # a few dozen; llguidance's token trie refuses tokens thousands of bytes long.
    bpe.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=4096, max_token_length=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    ids = {}
    for name, text in ANSWERS.items():
        encoded = tokenizer.encode(text, add_special_tokens=False)
        assert len(encoded) == 1, (name, len(encoded))
        ids[name] = encoded[0]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    hidden = 128
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=eos, bos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                         torch_dtype="float32")
    model = Qwen3ForCausalLM(config)
    scores = torch.zeros(config.vocab_size)
    order = ([ids["good"], eos] if answer == "good" else
             [ids["authors_entity"], ids["authors_relation"], ids["control"], ids["good"],
              ids["authors_extract"], eos])
    for rank, token in enumerate(order):
        scores[token] = 50.0 - 8.0 * rank  # every ranked token above the rest (0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Norms keep their ones; every projection is zero, so each layer adds nothing
            # to the residual stream and the last hidden state is the embedding, e_0.
            if "norm" not in name:
                param.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        # RMSNorm scales e_0 to sqrt(hidden) e_0: column 0 of the head carries the scores.
        model.lm_head.weight[:, 0] = scores / hidden ** 0.5
    model.save_pretrained(directory, safe_serialization=True)
    model.generation_config.eos_token_id = eos
    model.generation_config.save_pretrained(directory)
    return directory


def _ray_init(num_cpus: int) -> None:
    import ray

    ray.init(num_cpus=num_cpus, include_dashboard=False, configure_logging=False,
             object_store_memory=200 * 1024 * 1024, log_to_driver=False)


def run_extract(captions: str, out: str, overrides: list[str], num_cpus: int,
                stages_of: tuple[str, str] | None = None, authors_out: str | None = None) -> int:
    """Our own CLI (`csclip extract`), in a Ray instance started here: init_ray finds it.
    stages_of: (model dir, report path) to write the stages report first. authors_out:
    then the same captions with `--prompts authors` (authors' format, prompt dump) there."""
    _ray_init(num_cpus)
    if stages_of is not None:
        Path(stages_of[1]).write_text(json.dumps(stages(stages_of[0])))
    from csclip.entry.extract import main

    args = ["--backend", "vllm", "--format", "jsonl", "--input", captions, "--out", out,
            "--set", "tracking.enabled=false"]
    for override in overrides:
        args += ["--set", override]
    code = main(args)
    if code or authors_out is None:
        return code
    print("--- authors prompt set ---", flush=True)
    return main([*args[:7], authors_out, *args[8:], "--prompts", "authors", "--out-format",
                 "authors", "--dump-prompts", f"{authors_out}.prompts.jsonl"])


def stages(model_dir: str) -> dict:
    """The ray remote args of each stage of the processor our config builds."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ray.data.llm import build_processor

    from csclip.config.extract import VllmConfig
    from csclip.extract.vllm import processor_config

    report = {}
    for device in ("gpu", "cpu"):
        cfg = VllmConfig(model_source=model_dir, device=device, stage_num_cpus=0.5,
                         tokenizer_stages=True)  # every stage the config can build
        processor = build_processor(processor_config(cfg))
        report[device] = {name: {k: v for k, v in stage.map_batches_kwargs.items()
                                 if k in ("num_cpus", "num_gpus", "resources", "accelerator_type")}
                          for name, stage in processor.stages.items()}
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model")
    model.add_argument("dir")
    model.add_argument("--answer", choices=["good", "control"], default="good")
    extract = sub.add_parser("extract")
    extract.add_argument("captions")
    extract.add_argument("out")
    extract.add_argument("--set", dest="overrides", action="append", default=[])
    extract.add_argument("--num-cpus", type=int, default=4)
    extract.add_argument("--stages", nargs=2, metavar=("MODEL_DIR", "REPORT"), default=None)
    extract.add_argument("--authors-out", default=None)
    args = parser.parse_args()
    if args.command == "model":
        print(make_model(Path(args.dir), args.answer))
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    return run_extract(args.captions, args.out, args.overrides, args.num_cpus, args.stages,
                       args.authors_out)


if __name__ == "__main__":
    sys.exit(main())
