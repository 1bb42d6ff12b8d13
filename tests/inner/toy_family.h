// A third model family, defined outside inner/ the way a user would add one: its module and its
// row, registered at run time (inner::RegisterFamily) instead of a row in inner/model/families.cc.
// It touches no other file. The model: token embeddings, blocks of a pre-LayerNorm GELU MLP on the
// residual stream (no attention: each position sees only itself), a final LayerNorm and a head.
#ifndef ATOLL_TESTS_INNER_TOY_FAMILY_H_
#define ATOLL_TESTS_INNER_TOY_FAMILY_H_

#include "inner/model/family.h"

namespace atl::testing::toy {

extern const inner::ModelFamily kFamily;

// Registers the family once (every test that uses it calls it first).
void Register();

}  // namespace atl::testing::toy

#endif  // ATOLL_TESTS_INNER_TOY_FAMILY_H_
