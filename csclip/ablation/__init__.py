"""Ray Tune ablations in the layout of the paper's Tables 16-17: grid specs (grid.py), the
trial (trial.py), the sweep (sweep.py), its report (report.py), the console lines
(console.py) and the Tune callback (callback.py). The paper report that puts sweeps beside
the paper's numbers is csclip.report. Evaluation never imports this package."""

__all__ = ["callback", "console", "grid", "report", "sweep", "trial"]
