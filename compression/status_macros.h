// Status propagation for every atoll library (absl only, header only): it lives in the lowest
// library so that compression/, inner/, outer/ and src/ all share it without an upward include.
//
//   ATL_RETURN_IF_ERROR(DoThing());             // returns DoThing()'s status when it is not OK
//   ATL_ASSIGN_OR_RETURN(auto value, MakeIt());  // value = *MakeIt(), or returns its status
//
// Both take absl::Status or absl::StatusOr<T> expressions and return from any function whose
// return type an absl::Status converts to (absl::Status, absl::StatusOr<U>).
#ifndef ATOLL_COMPRESSION_STATUS_MACROS_H_
#define ATOLL_COMPRESSION_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::status_internal {

inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace atl::status_internal

#define ATL_STATUS_CONCAT_INNER_(a, b) a##b
#define ATL_STATUS_CONCAT_(a, b) ATL_STATUS_CONCAT_INNER_(a, b)

#define ATL_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                              \
    if (auto&& atl_status_ = (expr); !atl_status_.ok()) {                           \
      return ::atl::status_internal::StatusOf(atl_status_);                         \
    }                                                                               \
  } while (false)

#define ATL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = *std::move(tmp)

#define ATL_ASSIGN_OR_RETURN(lhs, rexpr) \
  ATL_ASSIGN_OR_RETURN_IMPL_(ATL_STATUS_CONCAT_(atl_statusor_, __LINE__), lhs, rexpr)

#endif  // ATOLL_COMPRESSION_STATUS_MACROS_H_
