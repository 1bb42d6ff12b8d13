// Payload assembly on arbitrary chunks: the in-order stream checks (ChunkStream) and the any-order
// assembler islands use, then decoding what was accepted.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compression/checksum.h"
#include "outer/base/decoded_kept.h"
#include "outer/base/payload.h"
#include "tests/fuzz/fuzz_input.h"

namespace pb = ::atollpb::v1;
using namespace atl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.Number<uint8_t>();
  auto spec = compression::MakeSpec(1 + in.Number<uint8_t>() % 5, in.Number<uint16_t>());
  if (!spec.ok()) spec = compression::ParseCodec("fp4_e2m1");
  const uint64_t n = 1 + in.Number<uint16_t>() % 5000;
  const outer::PayloadId id{"run", "a", 3, 1};
  outer::ChunkStream stream(id, *spec, n, 1 + (flags >> 2) % 4);
  outer::Assembler assembler(id, n, 0, n, *spec);
  while (!in.empty()) {
    pb::Chunk chunk;
    if (!chunk.ParseFromString(in.Record())) continue;
    // Optionally make the ids and the checksum right, so that the deeper checks are reached.
    if (flags & 1) {
      auto* h = chunk.mutable_header();
      h->set_run_id(id.run_id);
      h->set_island_id(id.island_id);
      h->set_round(id.round);
      h->set_fragment(id.fragment);
      h->set_fragment_elements(n);
      h->set_codec(pb::Codec(int(spec->codec)));
      h->set_block_size(spec->block_size);
    }
    if (flags & 2) {
      chunk.set_xxh64(compression::Checksum(chunk.data().data(), chunk.data().size()));
    }
    (void)assembler.Add(chunk);
    (void)stream.Add(pb::Chunk(chunk));
  }
  (void)assembler.CheckComplete();
  if (stream.complete()) {
    const outer::EncodedPayload payload = std::move(stream).Take();
    // The memory bound: the encoded size of what it covers, plus a scale block per range.
    const auto ranges = payload.Ranges();
    const uint64_t block = std::max<uint32_t>(1, spec->block_size);
    if (payload.bytes() > compression::EncodedBytes(*spec, payload.elements) +
                              ranges.size() * compression::EncodedBytes(*spec, block)) {
      std::abort();
    }
    uint64_t covered = 0;
    for (const auto& [a, b] : ranges) covered += b - a;
    if (covered != payload.elements) std::abort();  // ranges never overlap
    const auto stats = outer::Measure(payload);
    // Kept decoded, a sparse payload measures and reads the same (or is refused the same).
    outer::EncodedPayload kept = payload;
    outer::KeptBudget budget(uint64_t(1) << 26);
    const auto kept_stats = outer::MeasureAndKeep(&kept, &budget);
    if (stats.ok() != kept_stats.ok()) std::abort();
    if (stats.ok() && payload.codec.sparse()) {
      if (stats->sum_squares != kept_stats->sum_squares && !std::isnan(stats->sum_squares)) std::abort();
      std::vector<float> seen[2];
      for (int k = 0; k < 2; ++k) {
        (void)(k == 0 ? payload : kept)
            .VisitKept(ranges.front().first, ranges.front().second - ranges.front().first,
                       [&](uint64_t base, const uint32_t* index, const float* value, size_t m) {
                         for (size_t j = 0; j < m; ++j) {
                           seen[k].push_back(float(base + index[j]));
                           seen[k].push_back(value[j]);
                         }
                       });
      }
      if (seen[0].size() != seen[1].size() ||
          std::memcmp(seen[0].data(), seen[1].data(), seen[0].size() * 4) != 0) {
        std::abort();
      }
    }
    std::vector<float> window(std::min<uint64_t>(payload.elements, 100));
    (void)payload.Read(ranges.front().first, std::min(window.size(),
                                                      size_t(ranges.front().second - ranges.front().first)),
                       window.data());
  }
  return 0;
}
