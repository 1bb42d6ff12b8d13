// Runs a fuzz harness without libFuzzer (the g++ build of the test suite): every file of the seed
// corpus, then --runs inputs mutated from them (bit flips, byte values, inserted, deleted and
// duplicated ranges, splices of two seeds), deterministic for a --seed. A crash, an abort or a
// sanitizer report fails the run. The clang build links libFuzzer instead (deploy/fuzz.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string Mutate(const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  std::string s = corpus[pick(corpus.size())];
  const int edits = 1 + int(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= char(1 << (rng() % 8));
        break;
      case 1: {  // an interesting byte value
        static const uint8_t kValues[] = {0, 1, 0x7F, 0x80, 0xFF, 0xFE, 0x40, 0x20};
        if (!s.empty()) s[pick(s.size())] = char(kValues[rng() % sizeof(kValues)]);
        break;
      }
      case 2: {  // insert random bytes
        std::string add(1 + pick(16), '\0');
        for (char& c : add) c = char(rng());
        s.insert(pick(s.size() + 1), add);
        break;
      }
      case 3:  // delete a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(64, s.size() - at)));
        }
        break;
      case 4:  // duplicate a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.insert(pick(s.size() + 1), s.substr(at, 1 + pick(64)));
        }
        break;
      case 5: {  // splice with another seed
        const std::string& other = corpus[pick(corpus.size())];
        s = s.substr(0, pick(s.size() + 1)) + other.substr(pick(other.size() + 1));
        break;
      }
      default:  // overwrite 4 bytes with a random word (lengths, counts, offsets)
        if (s.size() >= 4) {
          const uint32_t w = uint32_t(rng()) >> (rng() % 32);
          std::memcpy(&s[pick(s.size() - 3)], &w, 4);
        }
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> corpus;
  long runs = 0;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atol(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::directory_iterator(arg)) {
        std::ifstream f(e.path(), std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        corpus.push_back(ss.str());
      }
    } else {
      std::fprintf(stderr, "usage: %s CORPUS_DIR... [--runs N] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  if (corpus.empty()) corpus.push_back("");
  for (const auto& s : corpus) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::mt19937_64 rng(seed);
  for (long r = 0; r < runs; ++r) {
    const std::string s = Mutate(corpus, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("%zu seeds and %ld mutated inputs ran without a crash\n", corpus.size(), runs);
  return 0;
}
