// The checkpoint reader on arbitrary files: an error naming the problem, never a crash, never an
// allocation a file's header merely claims. XXH64 is no secret, so a hostile file can carry valid
// checksums: with the first input byte odd, the harness writes the file with the header's and
// every tensor's checksum made right (input: flag byte, a header record, then the data region).
#include <cstring>

#include "atoll/v1/checkpoint.pb.h"
#include "compression/checksum.h"
#include "src/store/checkpoint.h"
#include "tests/fuzz/fuzz_input.h"

namespace pb = ::atollpb::v1;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  if (in.Number<uint8_t>() % 2 == 0) {
    const std::string path = atl::fuzz::WriteScratch("ckpt", data + 1, size > 0 ? size - 1 : 0);
    (void)atl::ReadCheckpoint(path);
    return 0;
  }
  std::string header_bytes = in.Record();
  const std::string region = in.Rest();
  pb::CheckpointHeader header;
  if (header.ParseFromString(header_bytes)) {
    for (auto& t : *header.mutable_tensors()) {
      if (t.offset() <= region.size() && t.num_bytes() <= region.size() - t.offset()) {
        t.set_xxh64(atl::compression::Checksum(region.data() + t.offset(), t.num_bytes()));
      }
    }
    header_bytes = header.SerializeAsString();
  }
  std::string file = "ATOLLCK1";
  const uint64_t len = header_bytes.size();
  const uint64_t sum = atl::compression::Checksum(header_bytes.data(), header_bytes.size());
  file.append(reinterpret_cast<const char*>(&len), 8);
  file.append(reinterpret_cast<const char*>(&sum), 8);
  file += header_bytes;
  file.resize((file.size() + 63) / 64 * 64, '\0');
  file += region;
  const std::string path = atl::fuzz::WriteScratch(
      "ckpt", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  (void)atl::ReadCheckpoint(path);
  return 0;
}
