// The service's account of where each island's tokens went (outer/service/token_ledger.h).
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "outer/service/token_ledger.h"

namespace atl::outer {
namespace {

TEST(TokenLedgerTest, SplitsTrainedIntoCommittedStaleRefusedAndRecomputed) {
  TokenLedger ledger;
  // Process 1 of island a trains 300, contributes 100 (on time) and 100 (late), then dies.
  ledger.Trained("a", 1, 300);
  ledger.Pushed("a", 0, 100);
  ledger.Committed("a", 100, /*stale=*/false);
  ledger.Pushed("a", 1, 100);
  ledger.Committed("a", 100, /*stale=*/true);
  auto a = ledger.Totals().at("a");
  EXPECT_EQ(a.trained, 300u);
  EXPECT_EQ(a.recomputed, 0u);  // still the latest: what it trained past its pushes may come yet
  // Process 2 (its restart): the 100 process 1 trained past its last push were trained again.
  ledger.Trained("a", 2, 50);
  a = ledger.Totals().at("a");
  EXPECT_EQ(a.trained, 350u);
  EXPECT_EQ(a.recomputed, 100u);
  EXPECT_EQ(a.on_time, 100u);
  EXPECT_EQ(a.stale, 100u);
}

TEST(TokenLedgerTest, ARefusedPushPushedAgainIsNotRefused) {
  TokenLedger ledger;
  ledger.Trained("a", 7, 100);
  ledger.Refused("a", 3, RefusalReason(absl::PermissionDeniedError("no longer a member")), 100);
  EXPECT_EQ(ledger.Totals().at("a").refused.at("not a member"), 100u);
  ledger.Refused("a", 3, "not a member", 100);  // the same refused again: counted once
  EXPECT_EQ(ledger.Totals().at("a").refused.at("not a member"), 100u);
  ledger.Pushed("a", 3, 100);  // after the rejoin: taken late
  ledger.Committed("a", 100, true);
  const auto a = ledger.Totals().at("a");
  EXPECT_TRUE(a.refused.empty());
  EXPECT_EQ(a.stale, 100u);
  EXPECT_EQ(a.trained, 100u);
}

TEST(TokenLedgerTest, NamesRefusalsAndSlicesWhatChanged) {
  EXPECT_EQ(RefusalReason(absl::FailedPreconditionError("round 2 has already committed")), "stale");
  EXPECT_EQ(RefusalReason(absl::InvalidArgumentError("claims 5 tokens")), "invalid");
  EXPECT_EQ(RefusalReason(absl::AlreadyExistsError("contributed")), "duplicate");
  TokenLedger ledger;
  ledger.Trained("a", 1, 10);
  ledger.Pushed("a", 0, 10);
  ledger.Committed("a", 10, false);
  auto slice = ledger.TakeSlice();
  EXPECT_EQ(slice.at("a").on_time, 10u);
  EXPECT_TRUE(ledger.TakeSlice().empty());  // nothing since
  ledger.Dropped("a", "dropped (non-finite combination)", 4);
  slice = ledger.TakeSlice();
  EXPECT_EQ(slice.at("a").refused.at("dropped (non-finite combination)"), 4u);
  EXPECT_EQ(slice.at("a").on_time, 0u);
}

TEST(TokenLedgerTest, IsBounded) {
  TokenLedger ledger;
  for (size_t i = 0; i < TokenLedger::kMaxIslands + 10; ++i) {
    ledger.Trained("island" + std::to_string(i), 1, 1);
  }
  EXPECT_EQ(ledger.Totals().size(), TokenLedger::kMaxIslands);
  for (uint64_t p = 1; p <= TokenLedger::kMaxProcesses + 10; ++p) ledger.Trained("island0", p, 5);
  // The oldest processes are folded into the island's account: nothing of theirs is lost.
  EXPECT_EQ(ledger.Totals().at("island0").trained, 5u * (TokenLedger::kMaxProcesses + 10));
  // A refused caller the ledger has not heard from is not taken on trust; claims saturate.
  ledger.Refused("stranger", 0, "not a member", 100);
  EXPECT_EQ(ledger.Totals().count("stranger"), 0u);
  ledger.Refused("island0", 0, "invalid", UINT64_MAX);
  ledger.Refused("island0", 1, "invalid", UINT64_MAX);
  EXPECT_EQ(ledger.Totals().at("island0").refused.at("invalid"), UINT64_MAX);
}

}  // namespace
}  // namespace atl::outer
