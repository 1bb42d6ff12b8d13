#include "outer/base/copies.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "compression/codec_math.h"
#include "outer/base/aggregation.h"

namespace atl::outer {
namespace {

// The first elements of the sampled windows, ascending, distinct: every window when there are
// few, else `count` drawn by the seed.
std::vector<uint64_t> SampledWindows(uint64_t n, uint32_t count, uint64_t seed) {
  const uint64_t windows = (n + kCopyWindow - 1) / kCopyWindow;
  std::vector<uint64_t> first;
  if (windows <= count) {
    for (uint64_t w = 0; w < windows; ++w) first.push_back(w * kCopyWindow);
    return first;
  }
  for (uint32_t j = 0; j < count; ++j) first.push_back(compression::math::Draw(seed, j) % windows * kCopyWindow);
  std::sort(first.begin(), first.end());
  first.erase(std::unique(first.begin(), first.end()), first.end());
  return first;
}

// Sparse: a contribution's kept indices in the windows, ascending.
bool KeptIndices(const EncodedPayload& p, const std::vector<uint64_t>& windows, uint64_t n,
                 std::vector<uint64_t>* out) {
  for (uint64_t first : windows) {
    const auto s = p.VisitKept(first, std::min(kCopyWindow, n - first),
                               [&](uint64_t base, const uint32_t* index, const float*, size_t m) {
                                 for (size_t j = 0; j < m; ++j) out->push_back(base + index[j]);
                               });
    if (!s.ok()) return false;
  }
  return true;
}

double Overlap(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  const size_t smaller = std::min(a.size(), b.size());
  if (smaller == 0) return 0;
  size_t shared = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] == b[j]) {
      ++shared, ++i, ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return double(shared) / double(smaller);
}

// Dense: a contribution's values in the windows.
bool Values(const EncodedPayload& p, const std::vector<uint64_t>& windows, uint64_t n,
            std::vector<float>* out) {
  for (uint64_t first : windows) {
    const uint64_t len = std::min(kCopyWindow, n - first);
    const size_t at = out->size();
    out->resize(at + len);
    if (!p.Read(first, len, out->data() + at).ok()) return false;
  }
  return true;
}

// Dense: the cosine of contributions a and b once the direction of the mean of the m - 2 others
// is projected out of both (g the Gram matrix of the m samples). Early in a run every island's
// update points one way (an honest pair's plain cosine reached 0.98 on micro): that is taken
// out, while a copy, scaled or not, stays parallel to its source. With 2 contributions: the
// plain cosine.
double Cosine(const std::vector<std::vector<double>>& g, size_t a, size_t b) {
  const size_t m = g.size();
  double ab = g[a][b], aa = g[a][a], bb = g[b][b];
  if (m > 2) {
    // o = sum of the others: o.a, o.b and o.o from the Gram matrix.
    double oa = 0, ob = 0, oo = 0;
    for (size_t i = 0; i < m; ++i) {
      if (i == a || i == b) continue;
      oa += g[i][a];
      ob += g[i][b];
      for (size_t j = 0; j < m; ++j) {
        if (j != a && j != b) oo += g[i][j];
      }
    }
    if (oo > 0) {
      ab -= oa * ob / oo;
      aa -= oa * oa / oo;
      bb -= ob * ob / oo;
    }
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

size_t Root(std::vector<size_t>& parent, size_t i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

}  // namespace

void WeighCopies(const CopyOptions& options, std::vector<ContributionRef>& contributions,
                 uint64_t n, uint64_t seed, CopyReport* report) {
  const size_t m = contributions.size();
  if (m < 2 || n == 0 || contributions[0].payload == nullptr) return;
  const bool sparse = contributions[0].payload->codec.sparse();
  const double threshold = sparse ? options.overlap : options.cosine;
  if (!(threshold > 0)) return;
  // 1. Each contribution's sample: kept indices or values in the windows.
  const std::vector<uint64_t> windows = SampledWindows(n, options.windows, seed);
  std::vector<std::vector<uint64_t>> kept(sparse ? m : 0);
  std::vector<std::vector<float>> values(sparse ? 0 : m);
  for (size_t i = 0; i < m; ++i) {
    const EncodedPayload* p = contributions[i].payload;
    if (p == nullptr || p->codec.sparse() != sparse) return;
    const bool read = sparse ? KeptIndices(*p, windows, n, &kept[i]) : Values(*p, windows, n, &values[i]);
    if (!read) return;
  }
  std::vector<std::vector<double>> gram(sparse ? 0 : m, std::vector<double>(m, 0.0));
  for (size_t a = 0; a < gram.size(); ++a) {
    for (size_t b = a; b < m; ++b) {
      double dot = 0;
      for (size_t k = 0; k < values[a].size() && k < values[b].size(); ++k) {
        dot += double(values[a][k]) * double(values[b][k]);
      }
      gram[a][b] = gram[b][a] = dot;
    }
  }
  // 2. Pairs at or above the threshold join one group.
  std::vector<size_t> parent(m);
  std::iota(parent.begin(), parent.end(), size_t(0));
  double most = 0;
  for (size_t a = 0; a < m; ++a) {
    for (size_t b = a + 1; b < m; ++b) {
      const double similar = sparse ? Overlap(kept[a], kept[b]) : Cosine(gram, a, b);
      most = std::max(most, similar);
      if (similar >= threshold) parent[Root(parent, b)] = Root(parent, a);
    }
  }
  // 3. A group weighs as one of its members.
  std::vector<std::vector<size_t>> groups(m);
  for (size_t i = 0; i < m; ++i) groups[Root(parent, i)].push_back(i);
  if (report != nullptr) report->most_similar = most;
  for (const auto& g : groups) {
    if (g.size() < 2) continue;
    std::vector<std::string> names;
    for (size_t i : g) {
      contributions[i].tokens = std::max<uint64_t>(1, contributions[i].tokens / g.size());
      names.push_back(contributions[i].island);
    }
    if (report != nullptr) report->groups.push_back(std::move(names));
  }
}

}  // namespace atl::outer
