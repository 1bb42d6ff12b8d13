#include "outer/in_process_transport.h"

#include "outer/payload.h"

namespace atl::outer {

absl::StatusOr<std::vector<pb::UpdateChunk>> UpdateChunksFor(
    SyncServer& server, const pb::UpdateRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  auto committed = server.AwaitUpdate(request, deadline, cancelled);
  if (!committed.ok()) return committed.status();
  std::vector<pb::UpdateChunk> out;
  const uint64_t begin = request.offset();
  const uint64_t end = request.num_elements() == 0 ? UINT64_MAX : begin + request.num_elements();
  // The hash of the range asked for, when the service knew the range at the commit.
  uint64_t range_hash = (*committed)->params_hash;
  if (request.num_elements() > 0) {
    auto it = (*committed)->range_hashes.find({begin, begin + request.num_elements()});
    range_hash = it == (*committed)->range_hashes.end() ? 0 : it->second;
  }
  for (const auto& c : (*committed)->update_chunks) {
    const uint64_t first = c.header().offset(), last = first + c.header().num_elements();
    if (last <= begin || first >= end) continue;
    pb::UpdateChunk u;
    // A rank asks for its range: it receives that (on whole scale blocks), not whole chunks.
    *u.mutable_chunk() = SliceChunk(c, server.options().codec, begin, end);
    u.set_params_hash((*committed)->params_hash);
    u.set_range_hash(range_hash);
    u.set_contributors(uint32_t((*committed)->contributors.size()));
    out.push_back(std::move(u));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].mutable_chunk()->mutable_header()->set_chunk_index(uint32_t(i));
    out[i].mutable_chunk()->mutable_header()->set_num_chunks(uint32_t(out.size()));
  }
  return out;
}

absl::StatusOr<std::vector<pb::UpdateChunk>> InProcessTransport::AwaitUpdate(
    const pb::UpdateRequest& r) {
  return UpdateChunksFor(*server_, r, absl::Now() + deadline_);
}

}  // namespace atl::outer
