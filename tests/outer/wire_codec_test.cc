// The codec numbers on the wire are the proto's (atoll.v1.Codec): every codec of the C++ table
// (compression/codec_traits.h) has the proto value named after it with the same number, and every
// proto value but CODEC_UNSPECIFIED is a codec of the table. A codec added on one side only, or
// numbered differently, fails here rather than on the wire.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "atoll/v1/outer.pb.h"
#include "compression/codec_traits.h"

namespace atl::outer {
namespace {

TEST(WireCodecTest, EveryCodecNumberIsTheProtoEnums) {
  const auto* proto = ::atollpb::v1::Codec_descriptor();
  size_t count = 0;
  const compression::CodecTraits* const* codecs = compression::Codecs(&count);
  ASSERT_GT(count, 0u);
  std::set<int> numbers;
  for (size_t i = 0; i < count; ++i) {
    const std::string name = "CODEC_" + absl::AsciiStrToUpper(codecs[i]->name);
    const auto* value = proto->FindValueByName(name);
    ASSERT_NE(value, nullptr) << codecs[i]->name << ": no " << name << " in atoll.v1.Codec";
    EXPECT_EQ(value->number(), int(codecs[i]->id)) << name;
    numbers.insert(int(codecs[i]->id));
  }
  for (int v = 0; v < proto->value_count(); ++v) {
    const auto* value = proto->value(v);
    if (value->number() == 0) continue;  // CODEC_UNSPECIFIED
    EXPECT_TRUE(numbers.count(value->number()))
        << value->name() << " = " << value->number() << " is no codec of compression/";
  }
}

}  // namespace
}  // namespace atl::outer
