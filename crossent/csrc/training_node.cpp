// The eager training step where the fused family takes it (crossent.dispatch.node_forward): a node of
// autograd's own, in C++, as eager PyTorch's losses are. Python's autograd.Function cost the step's
// host two to three times eager's (docs/design, "Host time" under "The gradient"); here the forward
// allocates the loss, the rows' (m, s) and the gradient, and the backward runs on autograd's engine with
// no Python. The arithmetic is crossent.autograd's: the same kernels, the same fields. The options
// build's alone; torch's headers come ahead of params.h (kBFloat16 is also torch's name).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <algorithm>
#include <cstring>

#include "params.h"

void launch_params(const Params& p);
Params unpack_params(const std::string& block);

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string pack(const Params& p) { return std::string(reinterpret_cast<const char*>(&p), sizeof p); }

template <class T>
T* pointer(const at::Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

// crossent.dispatch.empty_gradient's layout: channels last where the logits are, else contiguous.
at::Tensor empty_gradient(const at::Tensor& logits) {
  if (logits.dim() > 2 && logits.movedim(1, -1).is_contiguous()) {
    std::vector<int64_t> sizes = logits.sizes().vec();
    std::rotate(sizes.begin() + 1, sizes.begin() + 2, sizes.end());  // the classes last
    return at::empty(sizes, logits.options()).movedim(-1, 1);
  }
  return at::empty(logits.sizes(), logits.options());
}

// block: the fused launch's parameters, packed by the dispatch with no loss, state or gradient yet;
// gradient_group and gradient_grid: the gradient family's plan for the same rows, the backward's.
struct FusedLoss : torch::autograd::Function<FusedLoss> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                               const c10::optional<at::Tensor>& weight, const std::string& block,
                               int64_t gradient_group, int64_t gradient_grid, const std::vector<int64_t>& loss_shape) {
    Params p = unpack_params(block);
    const auto f32 = logits.options().dtype(at::kFloat);
    const bool none = p.reduction == kReductionNone;  // a loss per row, which the kernel writes in float32
    at::Tensor loss = at::empty(loss_shape, p.float32_out || none ? f32 : logits.options());
    const at::Tensor state = at::empty({int64_t(p.rows), 2}, f32);
    const at::Tensor dx = empty_gradient(logits);
    const at::Tensor scale = p.reduction == kReductionMean ? at::empty({}, f32) : at::Tensor();  // 1 / divisor
    const at::Tensor weight_total = weight && p.label_smoothing != 0.f ? weight->sum(at::kFloat) : at::Tensor();
    p.out = loss.data_ptr();
    p.losses = none ? loss.data_ptr<float>() : nullptr;
    p.row_state = pointer<float2>(state);
    p.grad = dx.data_ptr();
    p.grad_out = pointer<float>(scale);
    p.weight_total = pointer<const float>(weight_total);
    launch_params(p);
    p.family = kFamilyGradient;  // the backward's launch: these rows, the gradient family's plan
    p.group = int(gradient_group);
    p.grid = int(gradient_grid);
    // Saved for the backward's block, which points at them; autograd refuses logits changed since.
    ctx->save_for_backward({logits, targets, weight.value_or(at::Tensor()), state, scale, weight_total});
    ctx->saved_data["params"] = pack(p);
    ctx->saved_data["written"] = dx;  // for an incoming 1: the first backward's
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: no work for it
    if (none && !p.float32_out) loss = loss.to(logits.scalar_type());  // rounded as the kernel would
    return {loss, state};
  }

  // The gradient the forward wrote, its rows whose incoming gradient is not 1 (or that the
  // log-sum-exp's reaches) written anew; a second backward (retain_graph) writes every row.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(), "cross_entropy's gradient has no gradient of its own: double backward "
                "(create_graph=True through the loss) is not supported");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &scale = saved[4];
    Params p = unpack_params(ctx->saved_data["params"].toStringRef());
    const at::IValue written = std::exchange(ctx->saved_data["written"], at::IValue());
    at::Tensor grad = grads[0];
    if (!grad.defined())  // only the log-sum-exp reached the result
      grad = p.reduction == kReductionNone ? at::zeros({int64_t(p.rows)}, logits.options().dtype(at::kFloat))
                                           : at::zeros({}, logits.options().dtype(at::kFloat));
    // The incoming gradient as given, in its dtype; the kernel multiplies it by the mean's 1 / divisor
    // (scale): no launch here to convert or divide it.
    const at::Tensor grad_in = grad.reshape(-1).contiguous();
    const at::Tensor grad_lse = grads[1].defined() ? grads[1].select(1, 0).to(at::kFloat).contiguous() : at::Tensor();
    const at::Tensor dx = written.isTensor() ? written.toTensor() : empty_gradient(logits);
    p.stream = c10::cuda::getCurrentCUDAStream(logits.get_device()).stream();
    p.grad = dx.data_ptr();
    p.grad_out = grad_in.data_ptr();
    p.grad_scale = pointer<const float>(scale);
    p.grad_dtype = grad_in.scalar_type() == at::ScalarType::BFloat16 ? ::kBFloat16
                   : grad_in.scalar_type() == at::ScalarType::Half   ? ::kFloat16
                                                                     : ::kFloat32;
    p.grad_lse = pointer<const float>(grad_lse);
    p.grad_in = written.isTensor() ? grad_in.data_ptr() : nullptr;
    launch_params(p);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void define_training(pybind11::module_& m) {
  m.def("fused_loss",
        [](const at::Tensor& logits, const at::Tensor& targets, const c10::optional<at::Tensor>& weight,
           const std::string& block, int64_t gradient_group, int64_t gradient_grid, std::vector<int64_t> loss_shape) {
          return FusedLoss::apply(logits, targets, weight, block, gradient_group, gradient_grid, loss_shape);
        },
        "(loss, state) of a fused launch, with the loss's gradient as an autograd node.");
}
