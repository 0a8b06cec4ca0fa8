"""Evaluate a CLIP model on the half-truth benchmark (SPEC §4): `csclip evaluate`.

    python pipelines/evaluate.py --checkpoint runs/train/<run>/final --out runs/eval
    python pipelines/evaluate.py --checkpoint s3://bucket/runs/train/<run>/final --units s3://bucket/units
    python pipelines/evaluate.py --model ViT-B-32 --pretrained openai \
        --suite aro,sugarcrepe,winoground,coco_retrieval,zeroshot --data-root s3://bucket/bench

`--help` lists every flag; the parser and the code are csclip.entry.evaluate's.
"""

from __future__ import annotations

import sys

from csclip.entry.evaluate import main, overrides_from_args, parse_args

__all__ = ["main", "overrides_from_args", "parse_args"]

if __name__ == "__main__":
    sys.exit(main(prog="python pipelines/evaluate.py"))
