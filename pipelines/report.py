"""Our evaluations and ablation sweeps beside the paper's Tables 1, 6, 7, 16 and 17:
`csclip report --paper`.

    python pipelines/report.py --paper runs/eval/clip runs/eval/csclip-paper \
        runs/train/tune/<sweep>-report --out runs/paper

`--help` lists every flag; the parser and the code are csclip.entry.report's.
"""

from __future__ import annotations

import sys

from csclip.entry.report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(prog="python pipelines/report.py"))
