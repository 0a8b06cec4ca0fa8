"""Fine-tune a CLIP model on Ray Train (CS-CLIP, CLIP, NegCLIP); without arguments, the
demo: `csclip train` / `csclip demo`.

    python pipelines/train.py                                  # the demo (synthetic world, CPU)
    python pipelines/train.py --method clip --max-steps 200
    python pipelines/train.py --config configs/coco.yaml --units s3://bucket/units

`--help` lists every flag; the parser and the code are csclip.entry.train's.
"""

from __future__ import annotations

import sys

from csclip.entry.train import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(prog="python pipelines/train.py"))
