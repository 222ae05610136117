"""What a run will cost before it runs, on the meta device: `trainkit inspect` (inspect.py) and the
calibrated memory model (memory.py)."""
