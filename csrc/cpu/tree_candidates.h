// The sibling candidates of a draft tree on the CPU (csrc/cpu/tree_candidates.cpp; bound in python/bindings.cpp).
#pragma once

#include <ATen/ATen.h>

namespace csd {

// [B, P, K] int64: rank 0 main_tokens, ranks 1..K-1 Gumbel-top-(K-1) of log q without the main draft on the tree
// stream's uniforms of levels first .. first + P - 1 (-1 where q has no mass left), as reference.tree_candidates.
// Shape: seed [1] or [B], offset [1] or [B], main_tokens [B, P] (-1: none), q [B, P, V] float32.
at::Tensor tree_candidates_cpu(const at::Tensor& seed, const at::Tensor& offset, const at::Tensor& main_tokens,
                               const at::Tensor& q, int64_t branching, int64_t first);

}  // namespace csd
