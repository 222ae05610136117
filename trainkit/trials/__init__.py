"""Runs as processes, and what is built on them: one trial (run.py, its child in __main__.py), the
optimisation ladder (ladder.py, ladder_report.py) and the settings search (tune.py, tune_report.py)."""
from trainkit.trials.run import Trial, TrialError, TrialResult, run_trial

__all__ = ["Trial", "TrialError", "TrialResult", "run_trial"]
