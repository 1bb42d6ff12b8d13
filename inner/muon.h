// Muon (K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks", 2024) for the
// blocks' 2-D weight matrices, AdamW (inner/adamw.h) for the embeddings, the head, norms and
// biases. For each matrix W with gradient G:
//
//   m = mu m + G;   U = G + mu m (Nesterov) or m
//   O = NewtonSchulz(U): the quintic iteration X <- a X + (b A + c A A) X, A = X X^T, from
//       X = U / ||U||_F (transposed when rows > cols), (a, b, c) = (3.4445, -4.7750, 2.0315)
//   W <- W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
//
// The scale 0.2 sqrt(max(rows, cols)) is Moonlight's (J. Liu et al., arXiv 2502.16982, section
// 2.2): it gives the update AdamW's RMS, so that Muon takes AdamW's learning rate, schedule and
// weight decay unchanged. GPT's fused q/k/v matrix is three matrices (the plan's parts).
//
// The iteration needs the whole matrix. A rank holds parts of it (FSDP shards, TP slices): the
// parts of U are placed in a zeroed buffer of the stage's matrices and summed over the dp_shard
// and tp groups (one all-reduce each per step, the bytes of the stage's matrices), after which
// every rank that holds a part of a matrix runs the same iteration on the same bits and applies
// its own part. One rank is the case N = 1, without collectives. The iteration runs in fp32.
#ifndef ATOLL_INNER_MUON_H_
#define ATOLL_INNER_MUON_H_

#include <ATen/Tensor.h>

#include <memory>

#include "inner/inner_optimizer.h"

namespace atl::inner {

// The orthogonalized direction of the 2-D tensor g after `steps` quintic iterations (fp32).
at::Tensor NewtonSchulz(const at::Tensor& g, int steps);

// Muon over `model`'s shards: the matrices of the blocks, AdamW (optim.adamw) for the others.
std::unique_ptr<InnerOptimizer> NewMuon(const OptimConfig& optim, const ModelConfig& config,
                                        parallel::FsdpModel& model);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MUON_H_
