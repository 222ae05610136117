"""The profile reduction (compute / exposed communication / copies / idle) on a hand-made timeline:
the oracle is the interval arithmetic done by hand in the comments."""
from trainkit.profile import kernel_kind, timeline_summary


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
