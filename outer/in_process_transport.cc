#include "outer/in_process_transport.h"

#include "compression/status_macros.h"
#include "outer/payload.h"

namespace atl::outer {

absl::Status StreamUpdate(SyncServer& server, const pb::UpdateRequest& request,
                          absl::Time deadline, const std::function<bool()>& cancelled,
                          const std::function<bool(pb::UpdateChunk&&)>& write) {
  ATL_ASSIGN_OR_RETURN(auto committed, server.AwaitUpdate(request, deadline, cancelled));
  const CommittedRound& r = *committed;  // held alive by the pointer while it is streamed
  const uint64_t begin = request.offset();
  const uint64_t end = request.num_elements() == 0 ? UINT64_MAX : begin + request.num_elements();
  // The hash of the range asked for, when the service knew the range at the commit.
  uint64_t range_hash = r.params_hash;
  if (request.num_elements() > 0) {
    auto it = r.range_hashes.find({begin, begin + request.num_elements()});
    range_hash = it == r.range_hashes.end() ? 0 : it->second;
  }
  auto overlaps = [&](const pb::Chunk& c) {
    const uint64_t first = c.header().offset(), last = first + c.header().num_elements();
    return last > begin && first < end;
  };
  uint32_t num_chunks = 0;
  for (const auto& c : r.update_chunks) num_chunks += overlaps(c);
  uint32_t index = 0;
  for (const auto& c : r.update_chunks) {
    if (!overlaps(c)) continue;
    pb::UpdateChunk u;
    // A rank asks for its range: it receives that (on whole scale blocks), not whole chunks.
    *u.mutable_chunk() = SliceChunk(c, begin, end);
    u.mutable_chunk()->mutable_header()->set_chunk_index(index++);
    u.mutable_chunk()->mutable_header()->set_num_chunks(num_chunks);
    u.set_params_hash(r.params_hash);
    u.set_range_hash(range_hash);
    u.set_contributors(uint32_t(r.contributors.size()));
    if (!write(std::move(u))) return absl::CancelledError("the caller went away");
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::PushResponse> InProcessTransport::Push(const PushSource& source, int) {
  pb::PushRequest r;
  auto more = source(&r);
  if (!more.ok()) return more.status();
  if (!*more) return absl::InvalidArgumentError("empty push: no chunks");
  ATL_ASSIGN_OR_RETURN(auto stream, server_->OpenPush(r));
  do {
    ATL_RETURN_IF_ERROR(stream->Add(std::move(r)));
    r.Clear();
    more = source(&r);
    if (!more.ok()) return more.status();
  } while (*more);
  return server_->FinishPush(std::move(stream));
}

absl::Status InProcessTransport::AwaitUpdate(const pb::UpdateRequest& r,
                                             const ChunkSink<pb::UpdateChunk>& sink, int) {
  absl::Status taken;
  auto s = StreamUpdate(*server_, r, absl::Now() + deadline_, nullptr, [&](pb::UpdateChunk&& c) {
    taken = sink(std::move(c));
    return taken.ok();
  });
  return taken.ok() ? s : taken;
}

absl::Status InProcessTransport::FetchState(const pb::FetchStateRequest& r,
                                            const ChunkSink<pb::StateChunk>& sink, int) {
  absl::Status taken;
  auto s = server_->FetchState(r, [&](pb::StateChunk&& c) {
    taken = sink(std::move(c));
    return taken.ok();
  });
  return taken.ok() ? s : taken;
}

}  // namespace atl::outer
