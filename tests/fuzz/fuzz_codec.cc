// Every codec's decoder on arbitrary bytes (whole payloads and slices), dense and sparse (chunk
// top-k: arbitrary index lists must be refused, never followed), and the encoder on arbitrary
// floats: whatever an encoder writes, its decoder accepts (codec.h's promise).
#include <cmath>
#include <cstdlib>
#include <vector>

#include "compression/codec.h"
#include "tests/fuzz/fuzz_input.h"

using namespace atl::compression;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const int codec = 1 + in.Number<uint8_t>() % 7;
  const uint32_t block = in.Number<uint16_t>();
  const size_t n = in.Number<uint16_t>() % 4097;
  const size_t first = n ? in.Number<uint16_t>() % n : 0;
  const size_t count = n ? in.Number<uint16_t>() % (n - first + 1) : 0;
  const bool stochastic = in.Number<uint8_t>() & 1;
  const uint32_t topk = in.Number<uint16_t>();  // 0: dense
  auto spec = MakeSpec(codec, block, topk);
  if (!spec.ok()) spec = ParseCodec(CodecName(Codec(codec)));
  const std::string bytes = in.Rest();

  // Decoding arbitrary bytes: an error or finite values, never a crash.
  std::vector<float> out(n), slice(count);
  const auto* raw = reinterpret_cast<const uint8_t*>(bytes.data());
  auto decoded = Decode(*spec, raw, bytes.size(), n, out.data());
  if (decoded.ok()) {
    for (float v : out) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  (void)DecodeSlice(*spec, raw, bytes.size(), n, first, count, slice.data());

  // Encoding the bytes read as floats: refused only for non-finite input; what it writes decodes.
  std::vector<float> values(bytes.size() / 4);
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * 4);
  std::vector<uint8_t> encoded(EncodedBytes(*spec, values.size()));
  Rounding rounding;
  rounding.stochastic = stochastic;
  rounding.seed = values.size();
  if (Encode(*spec, values.data(), values.size(), encoded.data(), rounding).ok()) {
    std::vector<float> back(values.size());
    if (!Decode(*spec, encoded.data(), encoded.size(), values.size(), back.data()).ok()) {
      std::abort();  // an encoder wrote a payload its decoder refuses
    }
  }
  return 0;
}
