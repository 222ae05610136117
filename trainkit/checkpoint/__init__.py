"""The run's own state on disk: DCP save and newest-intact resume (dcp.py), the manifest that seals a
step (manifest.py), the reader that runs no code from a checkpoint (reader.py), what a resume may
change (resume_rules.py), and one live run per output.dir (run_lock.py)."""
