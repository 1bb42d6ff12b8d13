#include "tests/test_util.h"

namespace atl::testing {


Config TinyConfig(const std::string& data_path) {
  Config c;
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 2;
  c.model.context = 32;
  c.data.path = data_path;
  c.data.val_fraction = 0.1;
  c.train.steps = 40;
  c.train.batch_size = 4;
  c.train.eval_every = 10;
  c.train.eval_batches = 2;
  c.train.threads = 1;
  c.optim.lr = 3e-3;
  c.optim.warmup_steps = 5;
  c.train.log_every = 10;
  return c;
}

}  // namespace atl::testing
