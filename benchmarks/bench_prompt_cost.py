"""Calls and tokens per caption of the two prompt sets (`--prompts csclip` / `authors`) on
the same captions (SugarCrepe's COCO captions, shared/data/sugarcrepe).

No Qwen tokenizer is available offline here, so tokens are characters / 4. The answers
are modelled, not recorded: each caption's entities and relations come from the rules
extractor (a proxy for what the LLM finds), with 2 foils per entity and 3 per relation
written in each prompt set's JSON layout (json.dumps spacing, as Qwen writes it).

    python benchmarks/bench_prompt_cost.py [--limit N]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from csclip.extract import authors_prompts as ap
from csclip.extract.prompts import extraction_messages
from csclip.extract.rules import extract_units

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sugarcrepe"
CHAT_OVERHEAD = 20  # characters of the chat template around each turn (Qwen's <|im_start|> ...)


def tokens(text: str) -> float:
    return len(text) / 4


def _captions(limit: int) -> list[str]:
    seen: dict[str, None] = {}
    for path in sorted(DATA.glob("*.json")):
        for item in json.loads(path.read_text()).values():
            seen.setdefault(item["caption"], None)
    return list(seen)[:limit]


def _units(caption: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    result = extract_units(caption)
    return ([u.text for u in result.entities],
            [(u.subject, u.predicate, u.object) for u in result.relations])


def csclip_cost(caption: str) -> dict:
    entities, relations = _units(caption)
    answer = json.dumps({"entities": [{"entity": e, "foils": [
        {"foil": f"{e} foil", "change_type": "attribute_change"}] * 2} for e in entities],
        "relations": [{"subject": s, "predicate": p, "object": o, "foils": [
            {"subject": s, "predicate": f"not {p}", "object": o, "change_type": "antonym"}] * 3}
            for s, p, o in relations]})
    system, user = extraction_messages(caption)
    return {"calls": 1, "cached": tokens(system["content"]),
            "prefill": tokens(user["content"]) + CHAT_OVERHEAD / 4, "output": tokens(answer)}


def authors_cost(caption: str) -> dict:
    entities, relations = _units(caption)
    extract = json.dumps({"entities": entities, "relations": [
        {"subject": s, "relation_type": p, "object": o} for s, p, o in relations]})

    def answer_of(call: ap.Call) -> str:
        if call.kind == ap.EXTRACT:
            return extract
        if call.kind == ap.ENTITY_FOILS:
            return json.dumps({"negative_variants": [
                {"negative": f"{call.entity} foil", "change_type": "attribute_change"}] * 2})
        return json.dumps({"relation_negatives": [
            {"original_relation": p, "original_subject": s, "original_object": o,
             "negatives": [{"relation_type": f"not {p}", "change_type": "antonym"}] * 3}
            for s, p, o in relations[:ap.MAX_RELATIONS_WITH_FOILS]]})

    derived = ap.derive("x", 0, caption, None, answer_of)
    cached = {c.kind: tokens(ap.SYSTEM[c.kind]) for c, _ in derived.calls}
    return {"calls": len(derived.calls), "cached": sum(cached.values()),
            "prefill": sum(tokens(c.user) + CHAT_OVERHEAD / 4 for c, _ in derived.calls),
            "output": sum(tokens(a) for _, a in derived.calls)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=2000)
    captions = _captions(parser.parse_args().limit)
    print(f"{len(captions)} captions; tokens = characters / 4")
    for name, cost in (("csclip", csclip_cost), ("authors", authors_cost)):
        rows = [cost(c) for c in captions]
        mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
        print(f"{name:8s} calls {mean['calls']:.2f}  system prompts (cached) "
              f"{mean['cached']:.0f}  uncached prefill {mean['prefill']:.0f}  "
              f"output {mean['output']:.0f}")


if __name__ == "__main__":
    main()
