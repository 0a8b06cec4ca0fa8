"""Ray Tune ablations in the layout of the paper's Tables 16-17: grid specs (grid.py), the
trial (trial.py), the sweep (sweep.py) and its report (report.py); evaluations and sweeps
beside the paper's Tables 1, 6, 7, 16, 17 (paper_report.py, `csclip report --paper`).
Evaluation never imports this package."""
