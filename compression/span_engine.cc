#include "compression/span_engine.h"

#include <cstring>

#include "compression/codec.h"

namespace atl::compression {
namespace {

class HostEngine : public SpanEngine {
 public:
  bool on_device() const override { return false; }
  absl::Status MarkCompute() override { return absl::OkStatus(); }
  absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                      const Rounding& rounding) override {
    return compression::Encode(spec, in, n, out, rounding);
  }
  absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                      float* out) override {
    return compression::Decode(spec, in, bytes, n, out);
  }
  absl::Status Subtract(const float* a, const float* b, float* out, size_t n) override {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
    return absl::OkStatus();
  }
  absl::Status ToHost(void* host, const void* dev, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, dev, bytes);
    return absl::OkStatus();
  }
  absl::Status FromHost(void* dev, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dev, host, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<SpanEngine> SpanEngine::Host() { return std::make_unique<HostEngine>(); }

}  // namespace atl::compression
