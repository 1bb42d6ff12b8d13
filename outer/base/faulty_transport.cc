#include "outer/base/faulty_transport.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "outer/base/payload.h"

namespace atl::outer {

FaultyTransport::FaultyTransport(Transport* inner, Faults faults)
    : inner_(inner), faults_(faults), rng_(faults.seed) {}

bool FaultyTransport::Drop() {
  if (faults_.delay > absl::ZeroDuration()) absl::SleepFor(faults_.delay);
  std::lock_guard<std::mutex> lock(mu_);
  if (std::uniform_real_distribution<double>()(rng_) < faults_.drop) {
    ++dropped_;
    return true;
  }
  return false;
}

bool FaultyTransport::Corrupt(pb::Chunk& chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk.data().empty() || !(std::uniform_real_distribution<double>()(rng_) < faults_.corrupt)) {
    return false;
  }
  const size_t at = std::uniform_int_distribution<size_t>(0, chunk.data().size() - 1)(rng_);
  (*chunk.mutable_data())[at] ^= char(0x10);
  ++corrupted_;
  return true;
}

namespace {
absl::Status Dropped(const char* call) {
  return absl::UnavailableError(absl::StrCat(call, ": connection dropped (injected fault)"));
}
}  // namespace

absl::StatusOr<pb::JoinResponse> FaultyTransport::Join(const pb::JoinRequest& r) {
  if (Drop()) return Dropped("Join");
  return inner_->Join(r);
}

absl::Status FaultyTransport::Leave(const pb::LeaveRequest& r) {
  if (Drop()) return Dropped("Leave");
  return inner_->Leave(r);
}

absl::StatusOr<pb::HeartbeatResponse> FaultyTransport::Heartbeat(const pb::HeartbeatRequest& r) {
  if (Drop()) return Dropped("Heartbeat");
  return inner_->Heartbeat(r);
}

absl::StatusOr<pb::PushResponse> FaultyTransport::Push(const PushSource& source, int lane) {
  if (Drop()) return Dropped("Push");
  return inner_->Push(
      [&](pb::PushRequest* next) -> absl::StatusOr<bool> {
        auto more = source(next);
        if (more.ok() && *more) {
          if (faults_.scale_pushes != 1) Scale(*next->mutable_chunk());
          Corrupt(*next->mutable_chunk());
        }
        return more;
      },
      lane);
}

void FaultyTransport::Scale(pb::Chunk& chunk) const {
  const auto& h = chunk.header();
  auto spec = SpecOf(h);
  if (!spec.ok()) return;
  std::vector<float> values(h.num_elements());
  std::string& data = *chunk.mutable_data();
  if (!compression::Decode(*spec, reinterpret_cast<const uint8_t*>(data.data()), data.size(),
                           values.size(), values.data())
           .ok()) {
    return;
  }
  for (float& v : values) v *= faults_.scale_pushes;
  if (compression::Encode(*spec, values.data(), values.size(), reinterpret_cast<uint8_t*>(data.data()))
          .ok()) {
    chunk.set_xxh64(compression::Checksum(data.data(), data.size()));
  }
}

absl::Status FaultyTransport::AwaitUpdate(const pb::UpdateRequest& r,
                                          const ChunkSink<pb::UpdateChunk>& sink, int lane) {
  if (Drop()) return Dropped("AwaitUpdate");
  return inner_->AwaitUpdate(
      r,
      [&](pb::UpdateChunk&& c) {
        if (c.has_chunk()) Corrupt(*c.mutable_chunk());  // a relayed update's recipe may come alone
        return sink(std::move(c));
      },
      lane);
}

absl::Status FaultyTransport::FetchState(const pb::FetchStateRequest& r,
                                         const ChunkSink<pb::StateChunk>& sink, int lane) {
  if (Drop()) return Dropped("FetchState");
  return inner_->FetchState(
      r,
      [&](pb::StateChunk&& c) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          const uint64_t bytes = c.chunk().data().size();
          const bool crosses = faults_.cut_after_bytes > 0 && cut_ == 0 &&
                               state_bytes_ + bytes > faults_.cut_after_bytes;
          if (crosses) {
            ++cut_;
            return absl::UnavailableError(absl::StrCat(
                "FetchState: stream cut after ", faults_.cut_after_bytes, " bytes (injected fault)"));
          }
          state_bytes_ += bytes;
        }
        Corrupt(*c.mutable_chunk());
        return sink(std::move(c));
      },
      lane);
}

}  // namespace atl::outer
