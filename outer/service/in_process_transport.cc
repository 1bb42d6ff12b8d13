#include "outer/service/in_process_transport.h"

#include "compression/status_macros.h"
#include "outer/base/payload.h"

namespace atl::outer {

namespace {

// A relayed update: the recipe, then each term's contribution over [begin, end) (whole sparse
// chunks), numbered within the term; the requester's own is left out when it holds it. At least
// one message goes, so that the recipe and the hashes always arrive.
absl::Status StreamRelayed(const CommittedRound& r, const pb::UpdateRequest& request,
                           uint64_t begin, uint64_t end, uint64_t range_hash,
                           const std::function<bool(pb::UpdateChunk&&)>& write) {
  const pb::UpdateRecipe recipe = ToProto(r.recipe);
  auto message = [&] {
    pb::UpdateChunk u;
    *u.mutable_recipe() = recipe;
    u.set_params_hash(r.params_hash);
    u.set_range_hash(range_hash);
    u.set_contributors(uint32_t(r.contributors.size()));
    u.set_run_tokens(r.run_tokens);
    return u;
  };
  bool sent = false;
  for (size_t t = 0; t < r.recipe.terms.size(); ++t) {
    const std::string& island = r.recipe.terms[t].island;
    if (request.holds_own() && island == request.island_id()) continue;
    const EncodedPayload& payload = *r.relayed[t];
    std::vector<const EncodedChunk*> overlapping;
    for (const auto& c : payload.chunks) {
      if (c.offset + c.count > begin && c.offset < end) overlapping.push_back(&c);
    }
    const PayloadId id{request.run_id(), island, r.round, r.fragment};
    const uint64_t fragment_elements =
        payload.chunks.empty() ? 0 : payload.chunks.back().offset + payload.chunks.back().count;
    for (size_t i = 0; i < overlapping.size(); ++i) {
      pb::UpdateChunk u = message();
      *u.mutable_chunk() =
          SliceChunk(ChunkOf(id, r.relayed_codec, *overlapping[i], fragment_elements, uint32_t(i),
                             uint32_t(overlapping.size())),
                     begin, end);
      if (!write(std::move(u))) return absl::CancelledError("the caller went away");
      sent = true;
    }
  }
  if (!sent && !write(message())) return absl::CancelledError("the caller went away");
  return absl::OkStatus();
}

}  // namespace

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
  if (!r.recipe.terms.empty()) {
    return StreamRelayed(r, request, begin, end, range_hash, write);
  }
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
    u.set_run_tokens(r.run_tokens);
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
