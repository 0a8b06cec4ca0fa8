"""Write any captions input as webdataset shards: `csclip shards`.

    python pipelines/shards.py --format world --out runs/world-shards   # the synthetic world
    python pipelines/shards.py --input dataset_coco.json --image-root /data/coco \
        --split train --out s3://bucket/coco-train
    python pipelines/shards.py --format world --encoding pixels --model csclip-tiny \
        --out runs/world-pixels

`--help` lists every flag; the parser and the code are csclip.entry.shards'.
"""

from __future__ import annotations

import sys

from csclip.entry.shards import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(prog="python pipelines/shards.py"))
