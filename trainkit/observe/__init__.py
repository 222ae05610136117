"""What a run reports: step metrics and trackers (metrics.py), the kernel profile (profile.py), the
end-of-run summary (summary.py), and the per-step sample log (sample_log.py)."""
