"""What the swap_negatives extraction stage costs per caption, against the per-epoch shuffle
it replaces (the sampler's swap rule on a record without stored shuffles).

    python benchmarks/bench_swap_negatives.py [--model en_core_web_sm] [--repeats 3]

Captions: every SugarCrepe caption in /work/shared/data/sugarcrepe (real COCO captions).
Stage: csclip.extract.swap_negatives.with_swap_negatives over them in one process (spaCy's
nlp.pipe, the four perturbations, NLTK tokenizing). Baseline, in the same process:
csclip.train.sampling.draw_caption_negative with swap_prob=1 on the same captions, once
(one epoch). Prints captions per CPU-second of each and the stage's cost in epochs of the
baseline. --model names an installed spaCy model; without it (none can be downloaded
here) the stage runs on the tests' stand-in (spacy.blank("en") and a POS word table) with
empty Punkt tables, so the cost of a real tagger is NOT in that number.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from csclip.config.extract import SwapNegativesConfig  # noqa: E402
from csclip.config.train import SamplingConfig  # noqa: E402
from csclip.extract import swap_negatives  # noqa: E402
from csclip.train.sampling import draw_caption_negative, sample_rng  # noqa: E402
from csclip.units import UnitsRecord  # noqa: E402

DATA = Path("/work/shared/data/sugarcrepe")


def captions() -> list[UnitsRecord]:
    texts = sorted({item["caption"].strip() for path in sorted(DATA.glob("*.json"))
                    for item in json.loads(path.read_text()).values()})
    return [UnitsRecord(f"c{i}", f"c{i}", text, "train", (), ()) for i, text in enumerate(texts)]


def pipeline(model: str | None):
    if model is not None:
        return swap_negatives.load_pipeline(model)
    import nltk  # noqa: PLC0415  optional extra, only for the stand-in's Punkt tables
    from swap_negatives_helpers import load_fixture, tagged_pipeline, untrained_punkt  # noqa: PLC0415

    nltk.data.path.insert(0, str(untrained_punkt(Path(tempfile.mkdtemp()))))
    return tagged_pipeline(load_fixture()["pos"])


def cpu_seconds(work) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    records = captions()
    nlp = pipeline(args.model)
    config, sampling = SwapNegativesConfig(), SamplingConfig(swap_prob=1.0)

    def stage():
        swap_negatives.with_swap_negatives(records, config, nlp)

    def epoch():
        for record in records:
            draw_caption_negative(record, sampling, sample_rng(0, record.sample_id, 0))

    stage()  # warm: spaCy's first batch builds its vocabulary
    stage_s = min(cpu_seconds(stage) for _ in range(args.repeats))
    epoch_s = min(cpu_seconds(epoch) for _ in range(args.repeats))
    n = len(records)
    print(f"{n} captions, spaCy pipeline: {args.model or 'stand-in (blank en + POS table)'}")
    print(f"swap_negatives stage: {n / stage_s:,.0f} captions/CPU-s ({stage_s / n * 1e6:.0f} us each)")
    print(f"per-epoch shuffle:    {n / epoch_s:,.0f} captions/CPU-s ({epoch_s / n * 1e6:.0f} us each)")
    print(f"stage / one epoch of shuffles: {stage_s / epoch_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
