// Helpers shared by the fuzz harnesses: a reader over the fuzzer's bytes (numbers and
// length-prefixed records), so one input can describe a codec, a range or a stream of messages.
#ifndef ATOLL_TESTS_FUZZ_FUZZ_INPUT_H_
#define ATOLL_TESTS_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace atl::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  // Little-endian, zero past the end.
  template <typename T>
  T Number() {
    T v{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  // A record of up to 2^24 bytes (u32 length, then the bytes; cut at the end of the input).
  std::string Record() {
    const uint32_t len = Number<uint32_t>() & 0xFFFFFF;
    const size_t n = std::min<size_t>(len, size_ - pos_);
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends a record in Input's format (for seed generators).
inline void AppendRecord(std::string& out, const std::string& record) {
  const uint32_t len = uint32_t(record.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out += record;
}

// Writes bytes to a file under $TMPDIR (harnesses whose code under test reads files).
std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size);

}  // namespace atl::fuzz

#endif  // ATOLL_TESTS_FUZZ_FUZZ_INPUT_H_
