"""The steady state carries the reserved peak beside the allocated one: a CUDA graph's private pool is
reserved, not allocated, between replays, so a graphed run's allocated peak understates what it holds."""
from trainkit.observe.summary import steady_state


def _interval(step: int, allocated, reserved) -> dict:
    return {"step": step, "steps": 4, "step_time_s": 1.0, "samples_per_s_gpu": 8.0, "tokens_per_s_gpu": 1.0,
            "model_flops_per_s_gpu": 1.0, "mfu": 0.5, "data_wait_s": 0.0, "data_wait_frac": 0.0,
            "all_gathers_per_step": 0, "peak_flops": 1.0, "peak_mem_gib": allocated, "peak_reserved_gib": reserved}


def test_steady_state_keeps_the_largest_reserved_peak():
    got = steady_state([_interval(3, 50.0, 60.0), _interval(7, 57.5, 70.2), _interval(11, 57.4, 69.0)], skip_steps=4)
    assert got["peak_mem_gib"] == 57.5 and got["peak_reserved_gib"] == 70.2


def test_no_reserved_peak_off_cuda_or_in_older_records():
    assert steady_state([_interval(3, None, None)])["peak_reserved_gib"] is None
    old = _interval(3, 50.0, None)
    del old["peak_reserved_gib"]  # metrics.jsonl written before the key existed
    assert steady_state([old])["peak_reserved_gib"] is None
