// `atoll --version`: atoll's version and commit, the libtorch it was built against (CUDA or CPU,
// and the GPUs it sees), and where its codecs run.
#ifndef ATOLL_SRC_CLI_VERSION_H_
#define ATOLL_SRC_CLI_VERSION_H_

#include <string>

namespace atl {

std::string VersionText();

}  // namespace atl

#endif  // ATOLL_SRC_CLI_VERSION_H_
