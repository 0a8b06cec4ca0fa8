"""The entry points: each module holds one command's parser and `main(argv, prog)`.

`csclip <command>` (csclip/cli.py) and the scripts (pipelines/*.py, tune/ablate.py) call
the same `main`, so a flag, its help and its behaviour exist once. Heavy imports (torch,
ray) happen inside `main`, after parsing, so `--help` answers at once.
"""

__all__ = ["ablate", "benchmark", "common", "demo", "evaluate", "extract", "ray_init", "report",
           "train"]
