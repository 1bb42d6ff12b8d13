// What islands and the service compare to know they hold the same model. Torch-free.
#ifndef ATOLL_SRC_STORE_MODEL_HASHES_H_
#define ATOLL_SRC_STORE_MODEL_HASHES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "inner/model_config.h"

namespace atl {

// XXH64 of the resolved [model] config: islands and service must build the same model.
uint64_t ModelConfigHash(const inner::ModelConfig& model);
// The same for a model atoll does not build (a Python module): XXH64 of its parameters' names and
// shapes, in order.
uint64_t LayoutHash(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes);

}  // namespace atl

#endif  // ATOLL_SRC_STORE_MODEL_HASHES_H_
