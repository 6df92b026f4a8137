// Copyright 2026 The haste_hf Authors. Apache-2.0.
// Python entry points of the extension; haste_hf/kernels.py wraps them as torch.library custom ops.
#include <torch/extension.h>

namespace haste {
std::vector<std::string> kernel_paths(const at::Tensor& x, const at::Tensor& weight);
at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& supports,
                   const c10::optional<at::Tensor>& bias);
at::Tensor grad_weight(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& supports, int64_t G);
at::Tensor grad_input(const at::Tensor& grad_out, const at::Tensor& weight, const at::Tensor& supports, int64_t d,
                      bool deterministic);
std::vector<at::Tensor> linear_loss(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                    const c10::optional<at::Tensor>& supports, const at::Tensor& positions,
                                    int64_t valid_count, double scale, int64_t loss_kind, bool store_gradient);
std::vector<at::Tensor> group_sparse_topk(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& supports,
                                          const c10::optional<at::Tensor>& bias, int64_t k, int64_t valid_count);
}  // namespace haste

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("kernel_paths", &haste::kernel_paths, "Path (tensor_core / generic) of forward, grad_weight, grad_input");
  m.def("forward", &haste::forward, "out[b, k*G+g] = <weight[k, g], x[b, supports[k]]> (+ bias)");
  m.def("grad_weight", &haste::grad_weight, "Gradient of the weights on their supports");
  m.def("grad_input", &haste::grad_input, "Gradient of the features (split over groups)");
  m.def("linear_loss", &haste::linear_loss, "Loss of a dense or group-sparse layer and its logit gradient");
  m.def("group_sparse_topk", &haste::group_sparse_topk, "Per-warp top-k candidates of each row of the tail");
}
