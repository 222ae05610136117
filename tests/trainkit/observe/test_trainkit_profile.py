"""The profile reduction (compute / exposed communication / copies / idle) on a hand-made timeline:
the oracle is the interval arithmetic done by hand in the comments."""
from trainkit.observe.profile import kernel_kind, timeline_summary


def test_timeline_summary_splits_the_window():
    ns = 1_000_000  # 1 ms
    kernels = [
        ("sm90_xmma_gemm_bf16", 0, 10 * ns),          # compute [0, 10)
        ("triton_poi_fused_add_0", 8 * ns, 4 * ns),   # compute [8, 12) (overlaps the gemm)
        ("ncclDevKernel_AllGather_RING", 5 * ns, 10 * ns),  # comm [5, 15): exposed [12, 15) = 3
        ("Memcpy HtoD (Pinned -> Device)", 20 * ns, 2 * ns),  # copy [20, 22): exposed 2
        ("flash_fwd_kernel", 30 * ns, 5 * ns),        # compute [30, 35)
    ]
    s = timeline_summary(kernels, 50 * ns)
    assert s["compute_ms"] == 12 + 5
    assert s["exposed_comm_ms"] == 3 and s["comm_total_ms"] == 10
    assert s["exposed_copy_ms"] == 2
    assert s["idle_ms"] == 50 - (15 + 2 + 5)  # busy: [0, 15), [20, 22), [30, 35)
    assert s["compute_ms"] + s["exposed_comm_ms"] + s["exposed_copy_ms"] + s["idle_ms"] == s["window_ms"]
    assert (s["kernel_matmul_ms"], s["kernel_triton_ms"], s["kernel_attention_ms"]) == (10, 4, 5)


def test_kernel_kinds():
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_f32") == "nccl"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel") == "other"
    assert kernel_kind("fmha_cutlassB_bf16_aligned_64x64") == "attention"  # before "cutlass" -> matmul


def test_top_kernels_sums_by_name_per_step():
    from trainkit.observe.profile import top_kernels

    ns = 1_000_000
    kernels = [("sm90_gemm", 0, 4 * ns), ("triton_poi_fused", 5, 1 * ns), ("sm90_gemm", 9, 2 * ns)]
    top = top_kernels(kernels, n=1, per=2)
    assert top == [{"name": "sm90_gemm", "kind": "matmul", "ms": 3.0, "calls": 1.0}]


def test_gemm_table_reads_shapes_and_flops():
    import torch

    from trainkit.observe.profile import gemm_table

    x, w, b = torch.randn(64, 32), torch.randn(32, 16), torch.randn(16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            torch.mm(x, w)
            torch.addmm(b, x, w)
    rows = {r["op"]: r for r in gemm_table(prof, per=2, device=False)}
    assert set(rows) == {"aten::mm", "aten::addmm"}
    for r in rows.values():
        assert (r["m"], r["n"], r["k"], r["calls"]) == (64, 16, 32, 1.0)
        # TFLOP/s from the shapes and the host time numpy-free: 2*M*N*K per call over the summed time
        assert abs(r["tflops"] - 2 * 64 * 16 * 32 * 2 / (r["ms"] * 2 / 1e3) / 1e12) < 0.05 + 0.01 * r["tflops"]


def test_idle_by_host_names_what_the_host_did_while_the_gpu_waited():
    """Gaps between GPU activities, charged to the host events over them (by hand: the kernels run
    [0, 10) and [14, 20) and [30, 40); the gaps are [10, 14) and [20, 30))."""
    from trainkit.observe.profile import idle_by_host, idle_gaps

    ns = 1_000_000
    kernels = [("gemm", 0, 10 * ns), ("triton", 14 * ns, 6 * ns), ("gemm", 30 * ns, 10 * ns), ("copy", 2 * ns, 3 * ns)]
    gaps = idle_gaps(kernels)
    assert gaps == [(10 * ns, 14 * ns), (20 * ns, 30 * ns)]
    host = [
        ("trainkit.micro_step", 0, 12 * ns),           # over [10, 12) of the first gap: 2 ms
        ("trainkit.next_batch", 19 * ns, 9 * ns),     # over [20, 28): 8 ms
        ("aten::item", 21 * ns, 2 * ns),              # nested in next_batch, counts its own 2 ms
        ("cudaLaunchKernel", 1 * ns, 5 * ns),         # under busy GPU time only: not listed
        ("trainkit.optimizer", 9 * ns, 22 * ns),      # [9, 31) spans both gaps: 4 + 10 ms
    ]
    rows = idle_by_host(host, gaps, per=2)
    assert rows == [{"name": "trainkit.optimizer", "idle_ms": 7.0, "calls": 0.5},
                    {"name": "trainkit.next_batch", "idle_ms": 4.0, "calls": 0.5},
                    {"name": "trainkit.micro_step", "idle_ms": 1.0, "calls": 0.5},
                    {"name": "aten::item", "idle_ms": 1.0, "calls": 0.5}]
    assert idle_by_host(host, [], per=1) == []  # no gap, nothing charged


def test_host_events_reads_a_real_profile():
    """The trainer's phases come back by name from a CPU profile (record_function annotations)."""
    import torch
    from torch.profiler import record_function

    from trainkit.observe.profile import host_events

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with record_function("trainkit.next_batch"):
            torch.ones(4).sum().item()
    names = {n for n, _, _ in host_events(prof)}
    assert "trainkit.next_batch" in names and "aten::item" in names
