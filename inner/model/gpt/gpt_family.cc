// GPT-2's row of the family table: shapes, plan, FLOPs, checks, and its Hugging Face mapping
// (GPT2LMHeadModel).
//
// Names and layouts (atoll -> Hugging Face):
//   tok_emb.weight                -> transformer.wte.weight
//   pos_emb.weight                -> transformer.wpe.weight
//   blocks.L.ln1.{weight,bias}    -> transformer.h.L.ln_1.{weight,bias}   (ln2 -> ln_2)
//   blocks.L.attn.qkv.weight      -> transformer.h.L.attn.c_attn.weight   transposed [d, 3d]
//   blocks.L.attn.proj.weight     -> transformer.h.L.attn.c_proj.weight   transposed
//   blocks.L.mlp.fc.weight        -> transformer.h.L.mlp.c_fc.weight      transposed [d, 4d]
//   blocks.L.mlp.proj.weight      -> transformer.h.L.mlp.c_proj.weight    transposed [4d, d]
//   (biases keep their shape)     -> the same names with .bias
//   ln_f.{weight,bias}            -> transformer.ln_f.{weight,bias}
//   head.weight                   -> lm_head.weight  (atoll's head is untied from wte)
// GPT-2's Conv1D stores weights [in, out], hence the transposes. config.json: GPT2Config's n_embd,
// n_head, n_layer, n_positions, vocab_size, layer_norm_epsilon, activation_function.
#include "inner/model/gpt/gpt_family.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/model_info.h"
#include "inner/model/hf_mapping.h"

namespace atl::inner::gpt {
namespace {

using json = nlohmann::json;

ParamShapes Shapes(const ModelConfig& c) {
  const int64_t d = c.d_model;
  ParamShapes shapes = {{"tok_emb.weight", {c.vocab, d}}, {"pos_emb.weight", {c.context, d}}};
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    for (auto& [name, shape] : ParamShapes{{"ln1.weight", {d}},
                                           {"ln1.bias", {d}},
                                           {"attn.qkv.weight", {3 * d, d}},
                                           {"attn.qkv.bias", {3 * d}},
                                           {"attn.proj.weight", {d, d}},
                                           {"attn.proj.bias", {d}},
                                           {"ln2.weight", {d}},
                                           {"ln2.bias", {d}},
                                           {"mlp.fc.weight", {4 * d, d}},
                                           {"mlp.fc.bias", {4 * d}},
                                           {"mlp.proj.weight", {d, 4 * d}},
                                           {"mlp.proj.bias", {d}}}) {
      shapes.emplace_back(b + name, std::move(shape));
    }
  }
  shapes.push_back({"ln_f.weight", {d}});
  shapes.push_back({"ln_f.bias", {d}});
  shapes.push_back({"head.weight", {c.vocab, d}});
  return shapes;
}

ParallelPlan Plan(const ModelConfig&) {
  ParallelPlan p;
  p.blocks = "blocks";
  p.embeddings = {"tok_emb", "pos_emb"};
  p.tensor_parallel = {{"blocks.*.attn.qkv", TpStyle::kColumn, 3},
                       {"blocks.*.attn.proj", TpStyle::kRow, 1},
                       {"blocks.*.mlp.fc", TpStyle::kColumn, 1},
                       {"blocks.*.mlp.proj", TpStyle::kRow, 1}};
  return p;
}

// Kaplan et al.: 6 FLOPs per parameter per token (forward + backward), minus the position
// embedding lookups, plus attention scores and values: 6 * n_layer * context * d_model.
double TrainFlops(const ModelConfig& c) {
  const double n = double(ParameterCount(c)) - double(c.context) * c.d_model;
  return 6.0 * n + 6.0 * c.n_layer * c.context * c.d_model;
}

absl::Status ValidateTensorParallel(const ModelConfig& c, int tp) {
  if (c.n_head % tp != 0 || c.d_model % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.tensor_parallel_degree = ", tp, " must divide model.n_head (", c.n_head,
        ") and model.d_model (", c.d_model, "): each rank holds n_head / ", tp,
        " heads and 4 d_model / ", tp, " MLP units"));
  }
  return absl::OkStatus();
}

std::string HeadsText(const ModelConfig& c) { return absl::StrCat(c.n_head, " heads"); }

// The embeddings give the vocabulary, the width and the context; the blocks are counted.
absl::StatusOr<ModelConfig> FromShapes(const ShapeLookup& find, const ModelConfig& base) {
  const auto* wte = find("tok_emb.weight");
  const auto* wpe = find("pos_emb.weight");
  if (wte == nullptr || wpe == nullptr || wte->size() != 2 || wpe->size() != 2) {
    return absl::InvalidArgumentError("no 2-D token and position embeddings");
  }
  ModelConfig m = base;
  m.arch = kFamily.name;
  m.vocab = int((*wte)[0]);
  m.d_model = int((*wte)[1]);
  m.context = int((*wpe)[0]);
  m.n_layer = 0;
  while (find(absl::StrCat("blocks.", m.n_layer, ".ln1.weight")) != nullptr) ++m.n_layer;
  return m;
}

// ---- Hugging Face

// atoll's name pieces and GPT-2's, and whether GPT-2 stores the weight transposed (Conv1D).
struct NamePiece {
  const char* atoll;
  const char* gpt2;
  bool transposed_weight;
};
constexpr NamePiece kBlockPieces[] = {{"ln1.", "ln_1.", false},
                                      {"ln2.", "ln_2.", false},
                                      {"attn.qkv.", "attn.c_attn.", true},
                                      {"attn.proj.", "attn.c_proj.", true},
                                      {"mlp.fc.", "mlp.c_fc.", true},
                                      {"mlp.proj.", "mlp.c_proj.", true}};
constexpr NamePiece kTopPieces[] = {{"tok_emb.", "transformer.wte.", false},
                                    {"pos_emb.", "transformer.wpe.", false},
                                    {"ln_f.", "transformer.ln_f.", false},
                                    {"head.", "lm_head.", false}};

std::string HfName(const std::string& atoll_name, bool* transposed) {
  *transposed = false;
  const bool weight = absl::EndsWith(atoll_name, ".weight");
  if (absl::StartsWith(atoll_name, "blocks.")) {
    const size_t dot = atoll_name.find('.', 7);
    const std::string layer = atoll_name.substr(7, dot - 7), rest = atoll_name.substr(dot + 1);
    for (const auto& p : kBlockPieces) {
      if (absl::StartsWith(rest, p.atoll)) {
        *transposed = p.transposed_weight && weight;
        return absl::StrCat("transformer.h.", layer, ".", p.gpt2, rest.substr(std::strlen(p.atoll)));
      }
    }
  }
  for (const auto& p : kTopPieces) {
    if (absl::StartsWith(atoll_name, p.atoll)) {
      return absl::StrCat(p.gpt2, atoll_name.substr(std::strlen(p.atoll)));
    }
  }
  return atoll_name;
}

json HfConfig(const ModelConfig& m) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_embd", m.d_model},
          {"n_head", m.n_head},
          {"n_layer", m.n_layer},
          {"n_positions", m.context},
          {"n_ctx", m.context},
          {"vocab_size", m.vocab},
          {"layer_norm_epsilon", 1e-5},
          {"activation_function", "gelu_new"},
          {"tie_word_embeddings", false},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02}};
}

absl::StatusOr<ModelConfig> ModelOf(const json& j, const std::string& path) {
  using namespace hf_json;
  ModelConfig m;
  m.arch = kFamily.name;
  ATL_ASSIGN_OR_RETURN(m.d_model, Int(j, "n_embd", path));
  ATL_ASSIGN_OR_RETURN(m.n_head, Int(j, "n_head", path));
  ATL_ASSIGN_OR_RETURN(m.n_layer, Int(j, "n_layer", path));
  ATL_ASSIGN_OR_RETURN(m.context, Int(j, "n_positions", path));
  ATL_ASSIGN_OR_RETURN(m.vocab, Int(j, "vocab_size", path));
  ATL_RETURN_IF_ERROR(Expect(j, "layer_norm_epsilon", 1e-5, path));
  ATL_RETURN_IF_ERROR(Expect(j, "activation_function", "gelu_new", path));
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * m.d_model) {
    return Bad(path, absl::StrCat("n_inner = ", j["n_inner"].dump(), ": atoll's GPT-2 MLP is 4 x n_embd"));
  }
  return m;
}

// Rotary buffers of other tools' conversions, and GPT-2's attention masks.
bool IsBuffer(const std::string& name) {
  return absl::EndsWith(name, ".rotary_emb.inv_freq") || absl::EndsWith(name, ".attn.bias") ||
         absl::EndsWith(name, ".attn.masked_bias");
}

const char* NoTiedCopy(const ModelConfig&) { return nullptr; }

constexpr const char* kArchitectures[] = {"GPT2LMHeadModel"};

// GPT-2 files of other tools tie the head to the token embedding and omit it.
const HfMapping kHf = {.architectures = kArchitectures,
                       .model_type = "gpt2",
                       .marker = "transformer.wte.weight",
                       .name = HfName,
                       .config = HfConfig,
                       .model_of = ModelOf,
                       .is_buffer = IsBuffer,
                       .omittable = "head.weight",
                       .omitted_from = "transformer.wte.weight",
                       .tied_copy = NoTiedCopy};

}  // namespace

const ModelFamily kFamily = {.name = "gpt2",
                             .title = "GPT",
                             .shapes = Shapes,
                             .plan = Plan,
                             .train_flops_per_token = TrainFlops,
                             .validate_tensor_parallel = ValidateTensorParallel,
                             .validate = nullptr,
                             .settings = {},
                             .heads_text = HeadsText,
                             .from_shapes = FromShapes,
                             .hf = &kHf};

}  // namespace atl::inner::gpt
