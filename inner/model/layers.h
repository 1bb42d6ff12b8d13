// The layers a model family builds its modules from, with the points where a parallelization plan
// (inner/model/plan.h, applied by inner/parallel/) takes over: a linear layer's forward (tensor
// parallelism: column- or row-parallel), and the residual stream's sequence boundaries and dropout
// (sequence parallelism). Without a plan they compute what torch's layers compute, op for op.
#ifndef ATOLL_INNER_MODEL_LAYERS_H_
#define ATOLL_INNER_MODEL_LAYERS_H_

#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>

namespace atl::inner {

// How a linear layer computes x W^T + b once a plan has taken it over (its parameters then hold
// this rank's part).
class LinearStyle {
 public:
  virtual ~LinearStyle() = default;
  virtual torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias) = 0;
};

// torch::nn::Linear (the same parameters, names, initialization draws and forward), with a style.
class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  torch::Tensor forward(const torch::Tensor& x) {
    return style_ ? style_->Forward(x, weight, bias) : torch::nn::LinearImpl::forward(x);
  }
  void set_style(std::shared_ptr<LinearStyle> style) { style_ = std::move(style); }

 private:
  std::shared_ptr<LinearStyle> style_;
};
TORCH_MODULE(Linear);

// The residual stream under a plan that splits it over the sequence (dimension 1 of [B, T, d]):
// the embeddings' output is split, the head's input joined, and the residual dropout draws the
// whole sequence's mask and keeps the rank's slice of it.
class SequenceStyle {
 public:
  virtual ~SequenceStyle() = default;
  virtual torch::Tensor Split(const torch::Tensor& x) = 0;
  virtual torch::Tensor Join(const torch::Tensor& x) = 0;
  virtual torch::Tensor Dropout(const torch::Tensor& x, double p, bool training) = 0;
};

// The residual stream's dropout: torch's, or the style's.
torch::Tensor ResidualDropout(const torch::Tensor& x, double p, bool training,
                              SequenceStyle* style);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_LAYERS_H_
