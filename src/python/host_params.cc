#include "src/python/host_params.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"

namespace atl::python {
namespace {

namespace math = compression::math;

// IEEE half, to nearest with ties to even; beyond its range: infinity, as torch converts.
uint16_t HalfNearest(float f) {
  const uint32_t x = math::Bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u);  // NaN, infinity
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to infinity
  if (a < 0x38800000u) {                       // below 2^-14: a subnormal half (or zero)
    return sign | uint16_t(math::RoundHalfEven(math::FromBits(a) * 16777216.0f));  // x 2^24
  }
  uint32_t h = (((a >> 23) - 112u) << 10) | ((a & 0x7FFFFFu) >> 13);
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves the exponent up
  return sign | uint16_t(h);
}

float HalfValue(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = float(m) * 5.9604644775390625e-08f;  // 2^-24
    return sign != 0 ? -v : v;
  }
  if (e == 31) return math::FromBits(sign | 0x7F800000u | (m << 13));
  return math::FromBits(sign | ((e + 112u) << 23) | (m << 13));
}

float Read(const HostParam& p, size_t i) {
  switch (p.dtype) {
    case DType::kFloat32: return static_cast<const float*>(p.data)[i];
    case DType::kFloat64: return float(static_cast<const double*>(p.data)[i]);
    case DType::kBFloat16: return math::Bf16Value(static_cast<const uint16_t*>(p.data)[i]);
    case DType::kFloat16: return HalfValue(static_cast<const uint16_t*>(p.data)[i]);
  }
  return 0;
}

// theta = alpha * theta + (1 - alpha) * v, in the parameter's precision (fp64 in double, the
// others in float), rounded to its dtype.
void Write(const HostParam& p, size_t i, float v, double alpha) {
  if (p.dtype == DType::kFloat64) {
    double& t = static_cast<double*>(p.data)[i];
    t = alpha == 0.0 ? double(v) : alpha * t + (1.0 - alpha) * double(v);
    return;
  }
  const float merged = alpha == 0.0 ? v : float(alpha) * Read(p, i) + float(1.0 - alpha) * v;
  switch (p.dtype) {
    case DType::kFloat32: static_cast<float*>(p.data)[i] = merged; break;
    case DType::kBFloat16: static_cast<uint16_t*>(p.data)[i] = math::Bf16Nearest(merged); break;
    case DType::kFloat16: static_cast<uint16_t*>(p.data)[i] = HalfNearest(merged); break;
    case DType::kFloat64: break;
  }
}

// Canonical element k of a parameter sits at memory index Index(k): row-major, or (input-major
// 2-D weights) column by column.
template <typename Visit>
void ForEachCanonical(const inner::ParallelPlan& plan, const HostParam& p, Visit&& visit) {
  const bool transposed = inner::PlanOf(plan, p.name).input_major && p.shape.size() == 2;
  if (!transposed) {
    for (size_t i = 0, n = p.numel(); i < n; ++i) visit(i);
    return;
  }
  const size_t rows = size_t(p.shape[0]), cols = size_t(p.shape[1]);
  for (size_t c = 0; c < cols; ++c) {
    for (size_t r = 0; r < rows; ++r) visit(r * cols + c);
  }
}

}  // namespace

absl::StatusOr<DType> DTypeNamed(const std::string& name) {
  static const std::map<std::string, DType> kNames = {{"float32", DType::kFloat32},
                                                      {"float64", DType::kFloat64},
                                                      {"bfloat16", DType::kBFloat16},
                                                      {"float16", DType::kFloat16}};
  auto it = kNames.find(name);
  if (it == kNames.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", name, " tensor cannot be synced: parameters are float32, bfloat16, float16 or "
        "float64"));
  }
  return it->second;
}

uint64_t HostParam::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(std::max<int64_t>(d, 0));
  return n;
}

absl::Status CheckHostParams(const std::vector<HostParam>& params) {
  if (params.empty()) return absl::InvalidArgumentError("the module has no parameters to sync");
  std::map<std::string, size_t> names;
  std::map<uintptr_t, size_t> starts;
  for (size_t i = 0; i < params.size(); ++i) {
    const HostParam& p = params[i];
    for (int64_t d : p.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name,
                                                       "' has a negative dimension"));
      }
    }
    if (p.data == nullptr && p.numel() > 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' has no memory"));
    }
    if (!names.emplace(p.name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' is given twice"));
    }
    if (p.numel() == 0) continue;
    auto [it, fresh] = starts.emplace(reinterpret_cast<uintptr_t>(p.data), i);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters '", params[it->second].name, "' and '", p.name,
          "' are one tensor (tied weights): give the island each tensor once"));
    }
  }
  return absl::OkStatus();
}

std::vector<float> FlattenHost(const inner::ParallelPlan& plan, const std::vector<HostParam>& params,
                               const std::vector<size_t>& subset) {
  size_t total = 0;
  for (size_t i : subset) total += params[i].numel();
  std::vector<float> out;
  out.reserve(total);
  for (size_t i : subset) {
    const HostParam& p = params[i];
    if (p.dtype == DType::kFloat32 && !(inner::PlanOf(plan, p.name).input_major && p.shape.size() == 2)) {
      const float* f = static_cast<const float*>(p.data);
      out.insert(out.end(), f, f + p.numel());
      continue;
    }
    ForEachCanonical(plan, p, [&](size_t at) { out.push_back(Read(p, at)); });
  }
  return out;
}

void LoadHost(const inner::ParallelPlan& plan, const std::vector<float>& flat,
              const std::vector<HostParam>& params, const std::vector<size_t>& subset,
              double alpha) {
  size_t k = 0;
  for (size_t i : subset) {
    const HostParam& p = params[i];
    ForEachCanonical(plan, p, [&](size_t at) { Write(p, at, flat[k++], alpha); });
  }
}

}  // namespace atl::python
