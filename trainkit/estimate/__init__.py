"""What a run will cost before it runs, on the meta device: `trainkit inspect` (inspect.py), the
calibrated memory model (memory.py) and the one home of its inputs (inputs.py: `memory_inputs`,
read by inspect, tune and the trainer's launch check), and what the run asks of the data plan
(loader.py: its LoaderConfig and the `datakit plan` line)."""
