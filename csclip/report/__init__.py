"""Reports on top of evaluation and ablation: our runs beside the paper's Tables 1, 6, 7,
16 and 17 (paper.py, `csclip report --paper`) and the paper's numbers, copied from the
authors' outputs (paper_numbers.py). Evaluation and ablation never import this package."""

__all__ = ["paper", "paper_numbers"]
