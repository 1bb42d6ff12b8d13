#include "outer/base/update_recipe.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/status_macros.h"
#include "outer/base/aggregation.h"
#include "outer/base/names.h"
#include "outer/base/outer_optimizer.h"

namespace atl::outer {

pb::UpdateRecipe ToProto(const UpdateRecipe& recipe) {
  pb::UpdateRecipe out;
  for (const auto& t : recipe.terms) {
    auto* term = out.add_terms();
    term->set_island_id(t.island);
    term->set_tokens(t.tokens);
    term->set_scale(t.scale);
  }
  out.set_lr(recipe.lr);
  return out;
}

absl::StatusOr<UpdateRecipe> RecipeOf(const pb::UpdateRecipe& proto) {
  const size_t m = size_t(proto.terms_size());
  if (m == 0 || m > kMaxRecipeTerms) {
    return absl::InvalidArgumentError(absl::StrCat("an update recipe of ", m,
                                                   " terms (1 to ", kMaxRecipeTerms, ")"));
  }
  if (!std::isfinite(proto.lr())) {
    return absl::InvalidArgumentError("an update recipe's learning rate is not finite");
  }
  UpdateRecipe recipe;
  recipe.lr = proto.lr();
  std::set<std::string> seen;
  for (const auto& t : proto.terms()) {
    ATL_RETURN_IF_ERROR(ValidateName(t.island_id(), "an update recipe's island"));
    if (!seen.insert(t.island_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat("an update recipe names island ",
                                                     Printable(t.island_id()), " twice"));
    }
    if (t.tokens() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("an update recipe weighs island ",
                                                     Printable(t.island_id()), " by 0 tokens"));
    }
    if (!(t.scale() >= 0 && t.scale() <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("an update recipe scales island ",
                                                     Printable(t.island_id()), " by ", t.scale(),
                                                     " (not in [0, 1])"));
    }
    recipe.terms.push_back({t.island_id(), t.tokens(), t.scale()});
  }
  return recipe;
}

absl::Status RecipeUpdate(const UpdateRecipe& recipe,
                          const std::vector<const EncodedPayload*>& payloads, uint64_t first,
                          uint64_t n, float* u, WorkerPool* pool) {
  if (payloads.size() != recipe.terms.size()) {
    return absl::InvalidArgumentError(absl::StrCat(payloads.size(), " contributions for a recipe of ",
                                                   recipe.terms.size(), " terms"));
  }
  std::vector<ContributionRef> refs;
  std::vector<double> scale;
  for (size_t i = 0; i < payloads.size(); ++i) {
    refs.push_back({recipe.terms[i].island, recipe.terms[i].tokens, 0.0, payloads[i]});
    scale.push_back(recipe.terms[i].scale);
  }
  ATL_RETURN_IF_ERROR(CombineMean(refs, scale, first, n, u, pool));
  LinearStep(recipe.lr, u, u, size_t(n));
  return absl::OkStatus();
}

bool RelayIsSmaller(const compression::CodecSpec& contributions, uint32_t contributors,
                    uint64_t n) {
  if (!contributions.sparse()) return false;
  const uint64_t others = contributors > 0 ? contributors - 1 : 0;
  return others * compression::EncodedBytes(contributions, n) <=
         UpdateBytesAtMost(contributions, contributors, n);
}

size_t DownBytesAtMost(const compression::CodecSpec& contributions, uint32_t contributors,
                       uint64_t n, bool linear_step) {
  if (linear_step && RelayIsSmaller(contributions, contributors, n)) {
    return size_t(contributors > 0 ? contributors - 1 : 0) *
           compression::EncodedBytes(contributions, n);
  }
  return UpdateBytesAtMost(contributions, contributors, n);
}

RelayReceiver::RelayReceiver(PayloadId id, compression::CodecSpec codec,
                             uint64_t fragment_elements, uint64_t begin, uint64_t end,
                             const EncodedPayload* own)
    : id_(std::move(id)),
      codec_(codec),
      fragment_elements_(fragment_elements),
      begin_(begin),
      end_(end),
      own_(own) {}

absl::Status RelayReceiver::Add(pb::UpdateChunk&& message) {
  const std::string recipe = message.recipe().SerializeAsString();
  if (recipe_bytes_.empty()) {
    ATL_ASSIGN_OR_RETURN(recipe_, RecipeOf(message.recipe()));
    recipe_bytes_ = recipe;
    received_.resize(recipe_.terms.size());
  } else if (recipe != recipe_bytes_) {
    return absl::InvalidArgumentError("the messages of a relayed update disagree on its recipe");
  }
  if (!message.has_chunk()) return absl::OkStatus();
  const std::string& island = message.chunk().header().island_id();
  size_t t = 0;
  while (t < recipe_.terms.size() && recipe_.terms[t].island != island) ++t;
  if (t == recipe_.terms.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a relayed update carries a chunk of island ",
                                                   Printable(island),
                                                   ", which its recipe does not name"));
  }
  if (own_ != nullptr && island == id_.island_id) {
    return absl::InvalidArgumentError(
        "a relayed update carries this island's own contribution, which it holds");
  }
  const auto& h = message.chunk().header();
  if (h.offset() >= end_ || h.offset() + h.num_elements() <= begin_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a relayed chunk of island ", Printable(island), " holds elements [", h.offset(), ", ",
        h.offset() + h.num_elements(), "), outside the range asked for [", begin_, ", ", end_,
        ")"));
  }
  ATL_RETURN_IF_ERROR(CheckChunk({id_.run_id, island, id_.round, id_.fragment}, codec_,
                                 fragment_elements_, 0, fragment_elements_, message.chunk()));
  Received& r = received_[t];
  const uint32_t index = uint32_t(r.payload.chunks.size());
  if (h.chunk_index() != index || h.num_chunks() <= h.chunk_index() ||
      (index > 0 && h.num_chunks() != r.num_chunks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "relayed chunk ", h.chunk_index(), " of ", h.num_chunks(), " of island ",
        Printable(island), " arrived where chunk ", index, " was expected (chunks travel in order)"));
  }
  if (index > 0) {
    const EncodedChunk& prev = r.payload.chunks.back();
    if (h.offset() < prev.offset + prev.count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "relayed chunk ", index, " of island ", Printable(island), " starts at element ",
          h.offset(), ", inside what it already holds (up to ", prev.offset + prev.count, ")"));
    }
  }
  r.num_chunks = h.num_chunks();
  r.payload.codec = codec_;
  r.payload.elements += h.num_elements();
  r.payload.chunks.push_back(
      {h.offset(), h.num_elements(), std::move(*message.mutable_chunk()->mutable_data())});
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> RelayReceiver::Finish() const {
  if (recipe_bytes_.empty()) return absl::InvalidArgumentError("a relayed update without a recipe");
  std::vector<const EncodedPayload*> payloads;
  for (size_t t = 0; t < recipe_.terms.size(); ++t) {
    const std::string& island = recipe_.terms[t].island;
    if (own_ != nullptr && island == id_.island_id) {
      payloads.push_back(own_);
      continue;
    }
    const Received& r = received_[t];
    if (r.num_chunks == 0 || r.payload.chunks.size() != r.num_chunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a relayed update holds ", r.payload.chunks.size(), " of ", r.num_chunks,
          " chunks of island ", Printable(island), ", which its recipe names"));
    }
    payloads.push_back(&r.payload);
  }
  std::vector<float> u(end_ - begin_);
  ATL_RETURN_IF_ERROR(RecipeUpdate(recipe_, payloads, begin_, end_ - begin_, u.data()));
  return u;
}

}  // namespace atl::outer
