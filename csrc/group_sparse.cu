// Copyright 2026 The haste_hf Authors. Apache-2.0.
//
// Host side: picks the tensor-core or the generic kernel, sizes grids, launches on PyTorch's current
// stream under a device guard, and checks every launch. Inputs were validated in Python
// (haste_hf/kernels.py); the TORCH_CHECKs here guard the invariants the kernels rely on.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "group_sparse_kernels.cuh"

namespace haste {
namespace {

template <typename T> struct CudaType;
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<float> { using type = float; };

template <typename scalar_t>
typename CudaType<scalar_t>::type* ptr(const at::Tensor& t) {
  return reinterpret_cast<typename CudaType<scalar_t>::type*>(t.data_ptr<scalar_t>());
}

// bf16, fp16 and fp32 only (AT_DISPATCH_FLOATING_TYPES would add double); the tensor-core kernels
// exist for the two 16-bit types only.
#define HASTE_DISPATCH_16BIT(TYPE, NAME, ...)                                                        \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)                        \
                                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))
#define HASTE_DISPATCH(TYPE, NAME, ...)                                                              \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)                        \
                                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)                        \
                                         AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__))

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

const cudaDeviceProp& props() { return *at::cuda::getCurrentDeviceProperties(); }

// x^T [d][Bp], zero padded to a multiple of `multiple` rows of the batch.
at::Tensor transposed_padded(const at::Tensor& x, int64_t multiple) {
  const int64_t B = x.size(0), d = x.size(1);
  const int64_t Bp = round_up(std::max<int64_t>(B, 1), multiple);
  at::Tensor xt = at::zeros({d, Bp}, x.options());
  xt.narrow(1, 0, B).copy_(x.t());
  return xt;
}

// Shared memory of the forward's feature tile and of the feature gradient's accumulator (64-bit: the
// envelope check must not wrap for a wide d).
int64_t forward_smem_bytes(int64_t d, int64_t element_size) {
  return d * (kFwdBatchTile + kFwdRowPad) * element_size;
}
int64_t grad_input_smem_bytes(int64_t d) { return d * (kBwdBatchTile + kBwdRowPad) * static_cast<int64_t>(sizeof(float)); }

bool tensor_core_shape(const at::Tensor& weight) {
  const int64_t G = weight.size(1), F = weight.size(2);
  return (weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kHalf) && props().major >= 8 &&
         G % 16 == 0 && F % 32 == 0;
}

template <typename K>
void allow_smem(K kernel, int bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

int target_blocks() { return 2 * props().multiProcessorCount; }

// Grid of the tensor-core forward for a batch padded to Bp rows: (batch tiles, runs of 32-label units),
// about two blocks per SM.
struct ForwardGrid {
  dim3 grid;
  int64_t units_per_block;
};
ForwardGrid forward_grid(int64_t Bp, int64_t L) {
  const int64_t num_units = ceil_div(L, 32);
  const int64_t batch_tiles = Bp / kFwdBatchTile;
  const int64_t blocks_y =
      std::max<int64_t>(1, std::min<int64_t>(ceil_div(target_blocks(), batch_tiles), ceil_div(num_units, kWarps)));
  const int64_t units_per_block = round_up(ceil_div(num_units, blocks_y), kWarps);
  return {dim3(batch_tiles, ceil_div(num_units, units_per_block)), units_per_block};
}

// The tensor-core forward with epilogue MODE over x^T padded to a multiple of 64 rows; `out` is the
// [B, L] logits (kLogits), the logit gradient or nullptr (kLoss), unused (kTopK).
template <int MODE>
void launch_forward_mma(const at::Tensor& xt, const at::Tensor& weight, const at::Tensor& supports,
                        const at::Tensor& bias, void* out, int64_t B, const EpilogueArgs& ep) {
  const int64_t d = xt.size(0), Bp = xt.size(1), K = weight.size(0), G = weight.size(1), F = weight.size(2);
  const ForwardGrid fg = forward_grid(Bp, K * G);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  HASTE_DISPATCH_16BIT(xt.scalar_type(), "haste_forward", [&] {
    using T = typename CudaType<scalar_t>::type;
    const int smem = static_cast<int>(forward_smem_bytes(d, sizeof(T)));
    auto launch = [&](auto kernel) {
      allow_smem(kernel, smem);
      kernel<<<fg.grid, kThreads, smem, stream>>>(ptr<scalar_t>(xt), ptr<scalar_t>(weight), supports.data_ptr<int>(),
                                                  bias.defined() ? ptr<scalar_t>(bias) : nullptr,
                                                  reinterpret_cast<T*>(out), B, Bp, d, K, G, F, fg.units_per_block, ep);
    };
    if (G % 32 == 0)
      F % 64 == 0 ? launch(forward_mma_kernel<T, 32, 64, MODE>) : launch(forward_mma_kernel<T, 32, 32, MODE>);
    else
      F % 64 == 0 ? launch(forward_mma_kernel<T, 16, 64, MODE>) : launch(forward_mma_kernel<T, 16, 32, MODE>);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// Bias made contiguous and 4-byte aligned (the forward kernel reads it in pairs); undefined if absent.
at::Tensor forward_bias(const c10::optional<at::Tensor>& bias) {
  at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  if (bias_c.defined() && reinterpret_cast<uintptr_t>(bias_c.data_ptr()) % 4 != 0) bias_c = bias_c.clone();
  return bias_c;
}

}  // namespace

// Which path each pass takes for these shapes: "tensor_core" or "generic" (reported by the benchmark
// and asserted by the tests, so the fast path's envelope is visible rather than guessed).
std::vector<std::string> kernel_paths(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t d = x.size(1);
  const int64_t optin = props().sharedMemPerBlockOptin;
  const bool tc = tensor_core_shape(weight) && aligned16(weight);
  const bool fwd = tc && forward_smem_bytes(d, x.element_size()) <= optin;
  const bool bwd_x = tc && grad_input_smem_bytes(d) <= optin;
  return {fwd ? "tensor_core" : "generic", tc ? "tensor_core" : "generic", bwd_x ? "tensor_core" : "generic"};
}

at::Tensor forward(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& supports,
                   const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.is_cuda() && weight.is_cuda() && supports.is_cuda(), "haste forward: CUDA tensors expected");
  TORCH_CHECK(supports.scalar_type() == at::kInt, "haste forward: supports must be int32");
  TORCH_CHECK(weight.is_contiguous() && supports.is_contiguous(), "haste forward: weight/supports must be contiguous");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t B = x.size(0), d = x.size(1), K = weight.size(0), G = weight.size(1), F = weight.size(2);
  const int64_t L = K * G;
  TORCH_CHECK(d < INT32_MAX && K < INT32_MAX && G < INT32_MAX && F < INT32_MAX && B < INT32_MAX,
              "haste forward: each dimension must fit in int32");
  at::Tensor out = at::empty({B, L}, x.options());
  if (B == 0 || L == 0) return out;
  if (F == 0) return bias.has_value() ? out.copy_(bias->unsqueeze(0).expand({B, L})) : out.zero_();
  const at::Tensor xt = transposed_padded(x, kFwdBatchTile);
  const int64_t Bp = xt.size(1);
  const at::Tensor bias_c = forward_bias(bias);
  const bool fast = kernel_paths(x, weight)[0] == "tensor_core" && aligned16(out);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  if (fast) {
    launch_forward_mma<kLogits>(xt, weight, supports, bias_c, out.data_ptr(), B, EpilogueArgs{});
    return out;
  }
  HASTE_DISPATCH(x.scalar_type(), "haste_forward_generic", [&] {
    using T = typename CudaType<scalar_t>::type;
    const dim3 block(32, 8);
    const dim3 grid(ceil_div(L, 8), ceil_div(B, 32));
    forward_generic_kernel<T><<<grid, block, 0, stream>>>(ptr<scalar_t>(xt), ptr<scalar_t>(weight),
                                                          supports.data_ptr<int>(),
                                                          bias_c.defined() ? ptr<scalar_t>(bias_c) : nullptr,
                                                          ptr<scalar_t>(out), B, Bp, K, G, F);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor grad_weight(const at::Tensor& grad_out_in, const at::Tensor& x_in, const at::Tensor& supports,
                       int64_t G) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor grad_out = grad_out_in.contiguous();
  const at::Tensor x = x_in.contiguous();
  const int64_t B = x.size(0), d = x.size(1), K = supports.size(0), F = supports.size(1);
  const int64_t L = K * G;
  at::Tensor grad_w = at::empty({K, G, F}, x.options());
  if (grad_w.numel() == 0) return grad_w;
  if (B == 0) return grad_w.zero_();
  const bool fast = kernel_paths(x, grad_w)[1] == "tensor_core" && aligned16(grad_out) && aligned16(grad_w);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  if (fast) {
    const at::Tensor xt = transposed_padded(x, 32);
    const int64_t Bp = xt.size(1);
    HASTE_DISPATCH_16BIT(x.scalar_type(), "haste_grad_weight", [&] {
      using T = typename CudaType<scalar_t>::type;
      // Warps of 16-label units (G = 16, 48, ...) take 64 features when F allows: each grad_out row
      // they load then feeds twice the math (H100, G = 16: 1.3-1.6x faster than 32 features). Neither
      // 32 labels x 64 features (one block per SM, 186 registers) nor 16 x 128 paid off.
      auto launch = [&](auto kernel, int64_t label_width, int64_t feature_width) {
        const int64_t units = (L / label_width) * (F / feature_width);
        kernel<<<ceil_div(units, kWarps), kThreads, 0, stream>>>(ptr<scalar_t>(grad_out), ptr<scalar_t>(xt),
                                                                 supports.data_ptr<int>(), ptr<scalar_t>(grad_w),
                                                                 B, Bp, K, G, F);
      };
      if (G % 32 == 0) launch(grad_weight_mma_kernel<T, 32, 32>, 32, 32);
      else if (F % 64 == 0) launch(grad_weight_mma_kernel<T, 16, 64>, 16, 64);
      else launch(grad_weight_mma_kernel<T, 16, 32>, 16, 32);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return grad_w;
  }
  HASTE_DISPATCH(x.scalar_type(), "haste_grad_weight_generic", [&] {
    using T = typename CudaType<scalar_t>::type;
    const dim3 block(32, 8);
    const dim3 grid(ceil_div(L, 8), ceil_div(F, 32));
    grad_weight_generic_kernel<T><<<grid, block, 0, stream>>>(ptr<scalar_t>(grad_out), ptr<scalar_t>(x),
                                                              supports.data_ptr<int>(), ptr<scalar_t>(grad_w), B, d,
                                                              K, G, F);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_w;
}

at::Tensor grad_input(const at::Tensor& grad_out_in, const at::Tensor& weight, const at::Tensor& supports,
                      int64_t d, bool deterministic) {
  const c10::cuda::CUDAGuard guard(weight.device());
  const at::Tensor grad_out = grad_out_in.contiguous();
  const int64_t B = grad_out.size(0), K = weight.size(0), G = weight.size(1), F = weight.size(2);
  const int64_t L = K * G;
  at::Tensor grad_x = at::empty({B, d}, grad_out.options());
  if (grad_x.numel() == 0) return grad_x;
  if (L == 0 || F == 0) return grad_x.zero_();
  const at::Tensor x_meta = at::empty({0, d}, grad_out.options());
  const bool fast = kernel_paths(x_meta, weight)[2] == "tensor_core" && aligned16(grad_out);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::TensorOptions f32 = grad_out.options().dtype(at::kFloat);

  if (fast) {
    const int smem = static_cast<int>(grad_input_smem_bytes(d));
    const int64_t batch_tiles = ceil_div(B, kBwdBatchTile);
    // At most one wave of resident blocks: a second, partial wave would nearly double the time.
    const int64_t splits =
        std::max<int64_t>(1, std::min<int64_t>(target_blocks() / batch_tiles, ceil_div(K, kWarps)));
    const int64_t groups_per_block = round_up(ceil_div(K, splits), kWarps);
    const int64_t used_splits = ceil_div(K, groups_per_block);
    const dim3 grid(batch_tiles, used_splits);
    // grad_x^T in fp32: per split (deterministic) or accumulated by atomics.
    at::Tensor acc = deterministic ? at::empty({used_splits, d, B}, f32) : at::zeros({d, B}, f32);
    HASTE_DISPATCH_16BIT(grad_out.scalar_type(), "haste_grad_input", [&] {
      using T = typename CudaType<scalar_t>::type;
      auto launch = [&](auto kernel) {
        allow_smem(kernel, smem);
        kernel<<<grid, kThreads, smem, stream>>>(ptr<scalar_t>(grad_out), ptr<scalar_t>(weight),
                                                 supports.data_ptr<int>(), acc.data_ptr<float>(), B, d, K, G, F,
                                                 groups_per_block);
      };
      if (G % 32 == 0) deterministic ? launch(grad_input_mma_kernel<T, 32, true>) : launch(grad_input_mma_kernel<T, 32, false>);
      else deterministic ? launch(grad_input_mma_kernel<T, 16, true>) : launch(grad_input_mma_kernel<T, 16, false>);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const int threads = 256;
      const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(B * d, threads), 16 * props().multiProcessorCount));
      reduce_transpose_kernel<T><<<blocks, threads, 0, stream>>>(acc.data_ptr<float>(), ptr<scalar_t>(grad_x),
                                                                 deterministic ? static_cast<int>(used_splits) : 1,
                                                                 static_cast<int>(B), static_cast<int>(d));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return grad_x;
  }
  HASTE_DISPATCH(grad_out.scalar_type(), "haste_grad_input_generic", [&] {
    using T = typename CudaType<scalar_t>::type;
    if (deterministic) {
      // CSR of the supports by feature, (group, slot) pairs in increasing order: a fixed sum order.
      const at::Tensor flat = supports.reshape({-1}).to(at::kLong);
      const at::Tensor entries = std::get<1>(flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
      const at::Tensor counts = at::bincount(flat, /*weights=*/{}, /*minlength=*/d);
      const at::Tensor row_ptr = at::cat({at::zeros({1}, counts.options()), counts.cumsum(0)});
      const dim3 block(32, 8);
      const dim3 grid(ceil_div(d, 32), ceil_div(B, 8));
      grad_input_generic_deterministic_kernel<T><<<grid, block, 0, stream>>>(
          ptr<scalar_t>(grad_out), ptr<scalar_t>(weight), row_ptr.data_ptr<int64_t>(), entries.data_ptr<int64_t>(),
          ptr<scalar_t>(grad_x), B, d, K, G, F);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      at::Tensor acc = at::zeros({B, d}, f32);
      const dim3 block(32, 8);
      const dim3 grid(ceil_div(K, 8), ceil_div(F, 32), B);
      TORCH_CHECK(B <= 65535, "haste grad_input (generic path): batch above 65535 rows");
      grad_input_generic_kernel<T><<<grid, block, 0, stream>>>(ptr<scalar_t>(grad_out), ptr<scalar_t>(weight),
                                                               supports.data_ptr<int>(), acc.data_ptr<float>(), B, d,
                                                               K, G, F);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      grad_x.copy_(acc);
    }
  });
  return grad_x;
}

std::vector<at::Tensor> linear_loss(const at::Tensor& x_in, const at::Tensor& weight,
                                    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& supports,
                                    const at::Tensor& positions_in, int64_t valid_count, double scale,
                                    int64_t loss_kind, bool store_gradient) {
  TORCH_CHECK(x_in.is_cuda() && weight.is_cuda() && positions_in.is_cuda(), "haste linear_loss: CUDA tensors expected");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const bool sparse = supports.has_value();
  const int64_t B = x.size(0);
  const int64_t n = sparse ? weight.size(0) * weight.size(1) : weight.size(0);
  TORCH_CHECK(valid_count >= 0 && valid_count <= n, "haste linear_loss: valid_count must lie in [0, outputs]");
  TORCH_CHECK(B < INT32_MAX && n < (int64_t{1} << 40), "haste linear_loss: batch or outputs too large");
  at::Tensor grad = at::empty({store_gradient ? B : 0, n}, x.options());
  at::Tensor loss = at::zeros({}, x.options().dtype(at::kFloat));
  if (B == 0 || n == 0) return {loss, grad.zero_()};
  const at::Tensor positions = positions_in.to(at::kLong).contiguous();
  const int64_t P = positions.size(1), words = ceil_div(n, 32);
  at::Tensor mask = at::zeros({B, words}, x.options().dtype(at::kInt));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (B * P > 0) {
    positive_mask_kernel<<<ceil_div(B * P, 256), 256, 0, stream>>>(
        positions.data_ptr<int64_t>(), B, P, valid_count, reinterpret_cast<uint32_t*>(mask.data_ptr<int>()), words);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  at::Tensor partials;
  if (sparse && kernel_paths(x, weight)[0] == "tensor_core" && aligned16(grad)) {
    // The sparse tail: loss and logit gradient in the forward kernel's epilogue, no [B, n] logits.
    const at::Tensor xt = transposed_padded(x, kFwdBatchTile);
    const ForwardGrid fg = forward_grid(xt.size(1), n);
    partials = at::empty({int64_t{fg.grid.x} * fg.grid.y * kWarps}, x.options().dtype(at::kDouble));
    EpilogueArgs ep;
    ep.positive_mask = reinterpret_cast<const uint32_t*>(mask.data_ptr<int>());
    ep.mask_words = words;
    ep.scale = static_cast<float>(scale);
    ep.loss_kind = static_cast<int>(loss_kind);
    ep.loss_partials = partials.data_ptr<double>();
    ep.valid_count = valid_count;
    launch_forward_mma<kLoss>(xt, weight, *supports, forward_bias(bias), store_gradient ? grad.data_ptr() : nullptr, B,
                              ep);
  } else {
    // The dense head (cuBLAS) or a tail off the tensor-core path: logits, then one fused elementwise kernel
    // that sums the loss and turns them into the logit gradient in place.
    TORCH_CHECK(B <= 65535, "haste linear_loss: batches above 65535 rows are not supported; split the batch");
    at::Tensor logits = sparse ? forward(x, weight, *supports, bias)
                               : (bias.has_value() ? at::addmm(*bias, x, weight.t()) : at::mm(x, weight.t()));
    logits = logits.contiguous();
    const int64_t blocks_x = ceil_div(n, kLossThreads * kLossItems);
    partials = at::empty({B * blocks_x}, x.options().dtype(at::kDouble));
    HASTE_DISPATCH(logits.scalar_type(), "haste_linear_loss", [&] {
      using T = typename CudaType<scalar_t>::type;
      logits_loss_kernel<T><<<dim3(blocks_x, B), kLossThreads, 0, stream>>>(
          ptr<scalar_t>(logits), reinterpret_cast<const uint32_t*>(mask.data_ptr<int>()), words, n, valid_count,
          static_cast<float>(scale), static_cast<int>(loss_kind), store_gradient, partials.data_ptr<double>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    if (store_gradient) grad = logits;
  }
  // Partial sums in a fixed order: the loss is reproducible run to run.
  loss.copy_(partials.sum() * scale);
  return {loss, grad};
}

std::vector<at::Tensor> group_sparse_topk(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& supports,
                                          const c10::optional<at::Tensor>& bias, int64_t k, int64_t valid_count) {
  TORCH_CHECK(x_in.is_cuda() && weight.is_cuda() && supports.is_cuda(), "haste topk: CUDA tensors expected");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t B = x.size(0), L = weight.size(0) * weight.size(1);
  TORCH_CHECK(kernel_paths(x, weight)[0] == "tensor_core", "haste topk: tensor-core shapes only (has_fast_path)");
  TORCH_CHECK(k >= 1 && k < INT32_MAX && valid_count >= 0 && valid_count <= L, "haste topk: bad k or valid_count");
  const at::Tensor xt = transposed_padded(x, kFwdBatchTile);
  const int64_t lists = int64_t{forward_grid(xt.size(1), L).grid.y} * kWarps;
  at::Tensor scores = at::empty({B, lists * k}, x.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({B, lists * k}, x.options().dtype(at::kLong));
  if (B == 0 || L == 0) return {scores.fill_(-INFINITY), ids.fill_(-1)};
  EpilogueArgs ep;
  ep.valid_count = valid_count;
  ep.top_scores = scores.data_ptr<float>();
  ep.top_ids = ids.data_ptr<int64_t>();
  ep.k = static_cast<int>(k);
  launch_forward_mma<kTopK>(xt, weight, supports, forward_bias(bias), nullptr, B, ep);
  return {scores, ids};
}

}  // namespace haste
