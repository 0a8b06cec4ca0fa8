"""Ray Tune ablations in the layout of the paper's Tables 16-17: grid specs (grid.py), the
trial (trial.py), the sweep (sweep.py) and its report (report.py). Evaluation never
imports this package."""
