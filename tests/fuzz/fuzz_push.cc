// The service's push path on arbitrary message streams from a member (OpenPush, message-by-message
// checks, FinishPush), with the state checked untouched by every refused push.
#include <cstdlib>
#include <vector>

#include "compression/checksum.h"
#include "outer/service/sync_server.h"
#include "tests/fuzz/fuzz_input.h"

namespace pb = ::atollpb::v1;
using namespace atl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.Number<uint8_t>();
  outer::SyncServerOptions o;
  o.run_id = "run";
  o.num_data_streams = 2;
  o.codec = (flags & 8) ? *compression::ParseCodec("fp4_e2m1") : compression::CodecSpec{};
  o.async = flags & 16;
  o.max_update_norm = 10;
  o.max_update_value = 1000;
  o.tokens_per_step = 10;  // H = 100: at most 1000 tokens
  outer::SyncServer server(o, {{"w", "v"}, {40, 24}}, std::vector<float>(64, 0.5f));
  pb::JoinRequest join;
  join.set_run_id("run");
  join.set_name("a");
  const auto joined = server.Join(join);
  if (!joined.ok()) std::abort();
  const uint64_t hash = server.params_hash();

  std::vector<pb::PushRequest> requests;
  while (!in.empty()) {
    pb::PushRequest r;
    if (!r.ParseFromString(in.Record())) continue;
    if (flags & 1) {  // the right ids, so that the deeper checks are reached
      auto* h = r.mutable_chunk()->mutable_header();
      h->set_run_id("run");
      h->set_island_id("a");
      h->set_fragment_elements(64);
      h->set_codec(pb::Codec(int(o.codec.codec)));
      h->set_block_size(o.codec.block_size);
    }
    if (flags & 2) {
      r.mutable_chunk()->set_xxh64(
          compression::Checksum(r.chunk().data().data(), r.chunk().data().size()));
    }
    requests.push_back(std::move(r));
  }
  if (requests.empty()) return 0;
  if (flags & 4) requests.front().set_session(joined->session());
  auto pushed = server.Push(requests);
  if (!pushed.ok() && server.params_hash() != hash) std::abort();  // a refusal changed the state
  return 0;
}
