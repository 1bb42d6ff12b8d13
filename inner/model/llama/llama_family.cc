// Llama's row of the family table: its settings, shapes, plan, FLOPs, checks, and its Hugging
// Face mapping (LlamaForCausalLM).
//
// Names and layouts (atoll -> Hugging Face): "model." + atoll's name (atoll's Llama names are
// Hugging Face's without that prefix: model.embed_tokens.weight,
// model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight), except lm_head.weight (none
// when tied); every tensor in the same layout ([out, in] weights), rotary embeddings in the same
// rotate-half convention, so no permutation of q_proj / k_proj. config.json: LlamaConfig's
// hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, num_hidden_layers,
// rms_norm_eps, rope_theta, max_position_embeddings, vocab_size, tie_word_embeddings, hidden_act
// ("silu"), attention_bias / mlp_bias (false).
#include "inner/model/llama/llama_family.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/model_info.h"
#include "inner/model/hf_mapping.h"

namespace atl::inner::llama {
namespace {

using json = nlohmann::json;
using Kind = FamilySetting::Kind;

// In the order the model's hash and its files' metadata have always listed them.
double RawKvHeads(const ModelConfig& c) { return c.n_kv_head; }
double RawFfnHidden(const ModelConfig& c) { return c.ffn_hidden; }
double NormEps(const ModelConfig& c) { return c.norm_eps; }
double RopeTheta(const ModelConfig& c) { return c.rope_theta; }
double Tied(const ModelConfig& c) { return c.tie_embeddings ? 1 : 0; }

constexpr FamilySetting kSettings[] = {
    {.key = "n_kv_head",
     .kind = Kind::kInt,
     .value = [](const ModelConfig& c) { return double(KvHeads(c)); },
     .raw = RawKvHeads,
     .set = [](ModelConfig& c, double v) { c.n_kv_head = int(v); },
     .exclusive = true},
    {.key = "ffn_hidden",
     .kind = Kind::kInt,
     .value = [](const ModelConfig& c) { return double(FfnHidden(c)); },
     .raw = RawFfnHidden,
     .set = [](ModelConfig& c, double v) { c.ffn_hidden = int(v); },
     .exclusive = true},
    {.key = "norm_eps",
     .kind = Kind::kNumber,
     .value = NormEps,
     .raw = NormEps,
     .set = [](ModelConfig& c, double v) { c.norm_eps = v; },
     .exclusive = false},
    {.key = "rope_theta",
     .kind = Kind::kNumber,
     .value = RopeTheta,
     .raw = RopeTheta,
     .set = [](ModelConfig& c, double v) { c.rope_theta = v; },
     .exclusive = false},
    {.key = "tie_embeddings",
     .kind = Kind::kBool,
     .value = Tied,
     .raw = Tied,
     .set = [](ModelConfig& c, double v) { c.tie_embeddings = v != 0; },
     .exclusive = true},
};

absl::Status Validate(const ModelConfig& c) {
  if (c.n_kv_head < 0 || c.n_head % KvHeads(c) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.n_kv_head (", c.n_kv_head,
                                                   ") must divide model.n_head (", c.n_head,
                                                   "): each key/value head serves n_head / "
                                                   "n_kv_head query heads"));
  }
  if ((c.d_model / c.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model / model.n_head (", c.d_model / c.n_head,
        ") must be even: rotary embeddings turn pairs of each head's dimensions"));
  }
  if (c.ffn_hidden < 0 || c.ffn_multiple_of < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.ffn_hidden must be >= 0 and model.ffn_multiple_of positive, got ", c.ffn_hidden,
        " and ", c.ffn_multiple_of));
  }
  if (!(c.norm_eps > 0 && c.norm_eps < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("model.norm_eps must be in (0, 1), got ", c.norm_eps));
  }
  if (!(c.rope_theta > 1)) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_theta must be above 1, got ", c.rope_theta));
  }
  return absl::OkStatus();
}

ParamShapes Shapes(const ModelConfig& c) {
  const int64_t d = c.d_model, hd = c.d_model / c.n_head, kv = int64_t(KvHeads(c)) * hd,
                f = FfnHidden(c);
  ParamShapes shapes = {{"embed_tokens.weight", {c.vocab, d}}};
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string b = "layers." + std::to_string(l) + ".";
    for (auto& [name, shape] : ParamShapes{{"input_layernorm.weight", {d}},
                                           {"self_attn.q_proj.weight", {d, d}},
                                           {"self_attn.k_proj.weight", {kv, d}},
                                           {"self_attn.v_proj.weight", {kv, d}},
                                           {"self_attn.o_proj.weight", {d, d}},
                                           {"post_attention_layernorm.weight", {d}},
                                           {"mlp.gate_proj.weight", {f, d}},
                                           {"mlp.up_proj.weight", {f, d}},
                                           {"mlp.down_proj.weight", {d, f}}}) {
      shapes.emplace_back(b + name, std::move(shape));
    }
  }
  shapes.push_back({"norm.weight", {d}});
  if (!c.tie_embeddings) shapes.push_back({"lm_head.weight", {c.vocab, d}});
  return shapes;
}

ParallelPlan Plan(const ModelConfig&) {
  ParallelPlan p;
  p.blocks = "layers";
  p.embeddings = {"embed_tokens"};
  p.tensor_parallel = {{"layers.*.self_attn.q_proj", TpStyle::kColumn, 1},
                       {"layers.*.self_attn.k_proj", TpStyle::kColumn, 1},
                       {"layers.*.self_attn.v_proj", TpStyle::kColumn, 1},
                       {"layers.*.self_attn.o_proj", TpStyle::kRow, 1},
                       {"layers.*.mlp.gate_proj", TpStyle::kColumn, 1},
                       {"layers.*.mlp.up_proj", TpStyle::kColumn, 1},
                       {"layers.*.mlp.down_proj", TpStyle::kRow, 1}};
  return p;
}

// 6 FLOPs per parameter of a matrix product per token (forward + backward: every parameter but
// the embedding lookup's, the head's product counted once, tied or not; the norms' few are
// counted too), plus attention's scores and values, 6 * n_layer * context * d_model (the query
// heads' width: grouped-query attention shares keys and values, not the products with them).
double TrainFlops(const ModelConfig& c) {
  const double embedding = double(c.vocab) * c.d_model;
  const double n = double(ParameterCount(c)) - (c.tie_embeddings ? 0.0 : embedding);
  return 6.0 * n + 6.0 * c.n_layer * c.context * c.d_model;
}

absl::Status ValidateTensorParallel(const ModelConfig& c, int tp) {
  if (c.n_head % tp != 0 || KvHeads(c) % tp != 0 || FfnHidden(c) % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.tensor_parallel_degree = ", tp, " must divide model.n_head (", c.n_head,
        "), the key/value heads (model.n_kv_head: ", KvHeads(c), ") and the SwiGLU width (",
        FfnHidden(c), "): each rank holds n_head / ", tp, " query heads, n_kv_head / ", tp,
        " key/value heads and ffn_hidden / ", tp, " MLP units"));
  }
  return absl::OkStatus();
}

std::string HeadsText(const ModelConfig& c) {
  return absl::StrCat(c.n_head, " heads (", KvHeads(c), " key/value)");
}

// ---- Hugging Face

std::string HfName(const std::string& atoll_name, bool* transposed) {
  *transposed = false;
  return atoll_name == "lm_head.weight" ? atoll_name : "model." + atoll_name;
}

json HfConfig(const ModelConfig& m) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", m.d_model},
          {"intermediate_size", FfnHidden(m)},
          {"num_attention_heads", m.n_head},
          {"num_key_value_heads", KvHeads(m)},
          {"num_hidden_layers", m.n_layer},
          {"head_dim", m.d_model / m.n_head},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"max_position_embeddings", m.context},
          {"vocab_size", m.vocab},
          {"tie_word_embeddings", m.tie_embeddings},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"initializer_range", 0.02}};
}

absl::StatusOr<ModelConfig> ModelOf(const json& j, const std::string& path) {
  using namespace hf_json;
  ModelConfig m;
  m.arch = kFamily.name;
  ATL_ASSIGN_OR_RETURN(m.d_model, Int(j, "hidden_size", path));
  ATL_ASSIGN_OR_RETURN(m.ffn_hidden, Int(j, "intermediate_size", path));
  ATL_ASSIGN_OR_RETURN(m.n_head, Int(j, "num_attention_heads", path));
  ATL_ASSIGN_OR_RETURN(m.n_kv_head, Int(j, "num_key_value_heads", path, m.n_head));
  ATL_ASSIGN_OR_RETURN(m.n_layer, Int(j, "num_hidden_layers", path));
  ATL_ASSIGN_OR_RETURN(m.context, Int(j, "max_position_embeddings", path));
  ATL_ASSIGN_OR_RETURN(m.vocab, Int(j, "vocab_size", path));
  ATL_ASSIGN_OR_RETURN(m.norm_eps, Number(j, "rms_norm_eps", path, 1e-6));
  ATL_ASSIGN_OR_RETURN(m.rope_theta, Number(j, "rope_theta", path, 10000));
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_boolean()) {
    return Bad(path, "tie_word_embeddings must be true or false");
  }
  m.tie_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return Bad(path, absl::StrCat("rope_scaling = ", j["rope_scaling"].dump(),
                                  ": atoll's rotary embeddings have no scaling"));
  }
  ATL_RETURN_IF_ERROR(Expect(j, "hidden_act", "silu", path));
  ATL_RETURN_IF_ERROR(Expect(j, "attention_bias", false, path));
  ATL_RETURN_IF_ERROR(Expect(j, "mlp_bias", false, path));
  ATL_RETURN_IF_ERROR(Expect(j, "head_dim", m.d_model / m.n_head, path));
  return m;
}

bool IsBuffer(const std::string& name) { return absl::EndsWith(name, ".rotary_emb.inv_freq"); }

// A tied model's files may still hold lm_head.weight (a copy of the embeddings).
const char* TiedCopy(const ModelConfig& c) { return c.tie_embeddings ? "lm_head.weight" : nullptr; }

constexpr const char* kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM"};

const HfMapping kHf = {.architectures = kArchitectures,
                       .model_type = "llama",
                       .marker = "model.embed_tokens.weight",
                       .name = HfName,
                       .config = HfConfig,
                       .model_of = ModelOf,
                       .is_buffer = IsBuffer,
                       .omittable = nullptr,
                       .omitted_from = nullptr,
                       .tied_copy = TiedCopy};

}  // namespace

int KvHeads(const ModelConfig& c) { return c.n_kv_head > 0 ? c.n_kv_head : c.n_head; }

int FfnHidden(const ModelConfig& c) {
  if (c.ffn_hidden > 0) return c.ffn_hidden;
  const int64_t rule = 8 * int64_t(c.d_model) / 3;
  const int64_t m = std::max(1, c.ffn_multiple_of);
  return int((rule + m - 1) / m * m);
}

// Its files do not show the heads, the norms' epsilon or the rotary base: no from_shapes.
const ModelFamily kFamily = {.name = "llama",
                             .title = "Llama",
                             .shapes = Shapes,
                             .plan = Plan,
                             .train_flops_per_token = TrainFlops,
                             .validate_tensor_parallel = ValidateTensorParallel,
                             .validate = Validate,
                             .settings = kSettings,
                             .heads_text = HeadsText,
                             .from_shapes = nullptr,
                             .hf = &kHf};

}  // namespace atl::inner::llama
