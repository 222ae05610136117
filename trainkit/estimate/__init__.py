"""What a run will cost before it runs, on the meta device: `trainkit inspect` (inspect.py), the
calibrated memory model (memory.py), and what the run asks of the data plan (loader.py: its
LoaderConfig and the `datakit plan` line)."""
