"""Extract units and foils from captions into a sharded units table:
`csclip extract`.

    python pipelines/extract_units.py                      # synthetic world, gold units
    python pipelines/extract_units.py --backend rules --format sugarcrepe \
        --input sugarcrepe/data --out runs/sugarcrepe   # the SugarCrepe repository's data/
    python pipelines/extract_units.py --backend authors --input 'units/*.json' --out runs/authors
    ray job submit --working-dir . -- python pipelines/extract_units.py \
        --config configs/extract_coco.yaml --backend vllm --set backend.vllm.num_engines=8 \
        --input s3://bucket/dataset_coco.json --out s3://bucket/units

`--help` lists every flag; the parser and the code are csclip.entry.extract's.
"""

from __future__ import annotations

import sys

from csclip.entry.extract import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(prog="python pipelines/extract_units.py"))
