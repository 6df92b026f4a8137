# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Small run of every kernel (both kernel families, both feature-gradient modes, all dtypes, the fused
loss and top-k) for
compute-sanitizer: `compute-sanitizer --tool memcheck python benchmarks/kernels_sanitize.py`."""

import torch

from haste_hf.kernels import ops as kernels


def main():
    assert kernels.is_available()
    ops = torch.ops.haste
    torch.manual_seed(0)
    # (B, d, K, G, F): tensor-core shapes with ragged batches / a 16-label tail unit, then generic ones.
    for batch, features, groups, group_size, fan_in in [(70, 96, 5, 16, 32), (33, 130, 3, 48, 64), (9, 40, 3, 5, 7)]:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            x = torch.randn(batch, features, device="cuda", dtype=dtype)
            weight = torch.randn(groups, group_size, fan_in, device="cuda", dtype=dtype)
            supports = torch.rand(groups, features, device="cuda").argsort(1)[:, :fan_in].int().contiguous()
            bias = torch.randn(groups * group_size, device="cuda", dtype=dtype)
            grad_out = torch.randn(batch, groups * group_size, device="cuda", dtype=dtype)
            ops.group_sparse_forward(x, weight, supports, bias, False)
            ops.group_sparse_grad_weight(grad_out, x, supports, group_size)
            for deterministic in (False, True):
                ops.group_sparse_grad_input(grad_out, weight, supports, features, deterministic)
            # The fused loss (tensor-core epilogue or logits + elementwise kernel) and the fused top-k.
            positions = torch.randint(-1, groups * group_size + 3, (batch, 6), device="cuda")
            dense_weight = torch.randn(groups * group_size, features, device="cuda", dtype=dtype)
            for loss in ("bce", "squared_hinge"):
                for store in (False, True):
                    ops.linear_loss(
                        x, weight, bias, supports, positions, groups * group_size - 1, 0.5, loss, store, False
                    )
                    ops.linear_loss(
                        x, dense_weight, bias, None, positions, groups * group_size - 2, 0.5, loss, store, False
                    )
            if kernels.has_fast_path(x, weight):
                ops.group_sparse_topk(x, weight, supports, bias, 7, groups * group_size - 1)
    torch.cuda.synchronize()
    print("sanitizer workload done")


if __name__ == "__main__":
    main()
