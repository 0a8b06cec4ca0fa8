"""Ray Tune ablations in the layout of the paper's Tables 16-17: `csclip ablate`.

    python tune/ablate.py --grid lr,units                       # paper values, default config
    python tune/ablate.py --config configs/coco.yaml --grid lr=1e-6,5e-6 units=1,2
    python tune/ablate.py --grid lr,units --full-grid           # cross product
    python tune/ablate.py --grid lr,units --address 127.0.0.1:6379   # on a running Ray head
    ray job submit --working-dir . -- python tune/ablate.py --config configs/coco.yaml --grid lr

Axes: lr units relfrac swapfrac wd bs (see docs/ablation.md). `--help` lists every flag;
the parser and the code are csclip.entry.ablate's.
"""

from __future__ import annotations

import sys

from csclip.entry.ablate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(prog="python tune/ablate.py"))
