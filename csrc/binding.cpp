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
}  // namespace haste

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("kernel_paths", &haste::kernel_paths, "Path (tensor_core / generic) of forward, grad_weight, grad_input");
  m.def("forward", &haste::forward, "out[b, k*G+g] = <weight[k, g], x[b, supports[k]]> (+ bias)");
  m.def("grad_weight", &haste::grad_weight, "Gradient of the weights on their supports");
  m.def("grad_input", &haste::grad_input, "Gradient of the features (split over groups)");
}
