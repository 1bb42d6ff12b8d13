#include "outer/base/reused_buffers.h"

#include <utility>

namespace atl::outer {

void SpareChunkData::Keep(std::vector<pb::Chunk>& chunks, uint64_t max_bytes) {
  for (auto& c : chunks) {
    if (!Add(*c.mutable_data(), max_bytes)) return;
  }
}

bool SpareChunkData::Add(std::string& buffer, uint64_t max_bytes) {
  if (bytes + buffer.capacity() > max_bytes) return false;
  bytes += buffer.capacity();
  buffers.push_back(std::move(buffer));
  return true;
}

void BufferPool::Lend(std::string* data) {
  if (data->capacity() > 64) return;  // beyond any short-string buffer: it has its own
  std::lock_guard<std::mutex> lock(mu_);
  if (spare_.buffers.empty()) return;
  spare_.bytes -= spare_.buffers.back().capacity();
  data->swap(spare_.buffers.back());
  spare_.buffers.pop_back();
  data->clear();
}

void BufferPool::Recycle(std::vector<EncodedChunk>& chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : chunks) {
    if (!spare_.Add(c.data, max_bytes_)) return;
  }
}

uint64_t BufferPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spare_.bytes;
}

std::vector<std::string> WrittenBuffers(const std::vector<size_t>& sizes) {
  std::vector<std::string> out(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) out[i].resize(sizes[i]);  // zeros: every page written
  return out;
}

}  // namespace atl::outer
