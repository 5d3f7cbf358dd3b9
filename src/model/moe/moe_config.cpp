// The mixture-of-experts settings of TransformerConfig: which layers have an MoE FFN
// (--moe-layer-freq, as Megatron's moe_freq_type and get_moe_layer_pattern read it) and the
// checks of the MoE flags.
#include <cctype>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/moe/moe_pattern.h"
#include "model/transformer_config.h"

namespace megatron::model {

namespace {

// A recursive-descent reader of Megatron's list patterns (Python list expressions such as
// "([1]*3+[0]*1)*2" or "[1,0,1,0]"): lists of 0/1, '+' concatenation, '*' repetition by an
// integer, parentheses.
class PatternReader {
 public:
  explicit PatternReader(const std::string& text) : s_(text) {}
  std::vector<int> read() {
    std::vector<int> v = expr();
    skip();
    if (i_ != s_.size()) fail("unexpected '" + std::string(1, s_[i_]) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    MG_THROW("--moe-layer-freq '", s_, "': ", what, " at character ", i_ + 1,
             "; give an integer k (every k-th layer is MoE) or a Python list pattern of 0/1 such "
             "as \"[1,0,1,0]\" or \"([1]*3+[0]*1)*2\"");
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  long integer() {
    skip();
    const size_t b = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (b == i_) fail("expected an integer");
    if (i_ - b > 6) fail("integer too large");
    return std::stol(s_.substr(b, i_ - b));
  }
  std::vector<int> expr() {
    std::vector<int> v = term();
    while (eat('+')) {
      const std::vector<int> t = term();
      v.insert(v.end(), t.begin(), t.end());
    }
    return v;
  }
  std::vector<int> term() {
    std::vector<int> v = atom();
    while (eat('*')) {
      const long n = integer();
      if (n * long(v.size()) > 1000000) fail("pattern too long");
      std::vector<int> r;
      for (long k = 0; k < n; ++k) r.insert(r.end(), v.begin(), v.end());
      v = std::move(r);
    }
    return v;
  }
  std::vector<int> atom() {
    if (eat('(')) {
      std::vector<int> v = expr();
      if (!eat(')')) fail("expected ')'");
      return v;
    }
    if (eat('[')) {
      std::vector<int> v;
      if (eat(']')) return v;
      do {
        const long x = integer();
        if (x != 0 && x != 1) fail("list entries must be 0 or 1");
        v.push_back(int(x));
      } while (eat(','));
      if (!eat(']')) fail("expected ']' or ','");
      return v;
    }
    fail("expected '[' or '('");
  }
  const std::string& s_;
  size_t i_ = 0;
};

bool is_integer(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::vector<int> moe_layer_pattern(const std::string& freq, int num_layers) {
  if (is_integer(freq)) {
    const int k = std::stoi(freq);
    MG_REQUIRE(k >= 1, "--moe-layer-freq must be >= 1 (got ", k, ")");
    std::vector<int> v(static_cast<size_t>(num_layers));
    for (int i = 0; i < num_layers; ++i) v[size_t(i)] = i % k == 0 ? 1 : 0;
    return v;
  }
  std::vector<int> v = PatternReader(freq).read();
  MG_REQUIRE(int(v.size()) == num_layers, "--moe-layer-freq '", freq, "' gives ", v.size(),
             " layers but --num-layers is ", num_layers, "; the pattern needs one entry per layer");
  return v;
}

bool TransformerConfig::is_moe_layer(int layer) const {
  if (num_moe_experts <= 0) return false;
  return moe_layer_pattern(moe_layer_freq, num_layers).at(size_t(layer)) == 1;
}

void TransformerConfig::validate_moe() const {
  MG_REQUIRE(num_moe_experts >= 0, "--num-experts must be > 0 (got ", num_moe_experts, ")");
  if (num_moe_experts == 0) return;
  const int E = num_moe_experts;
  (void)moe_layer_pattern(moe_layer_freq, num_layers);
  MG_REQUIRE(family_id() == ModelFamilyId::gpt, "--num-experts: the mixture-of-experts layer is built for GPT "
             "models only; the ", model_family, " family cannot take it yet");
  MG_REQUIRE(!add_bias_linear, "--num-experts: the experts have no biases (as Megatron-Core's "
             "grouped experts); add --disable-bias-linear");
  MG_REQUIRE(moe_ffn_hidden_size >= 0, "--moe-ffn-hidden-size must be > 0");
  MG_REQUIRE(moe_router_topk >= 1 && moe_router_topk <= E, "--moe-router-topk ", moe_router_topk,
             " must be in [1, --num-experts=", E, "]");
  MG_REQUIRE(moe_router_score_function == "softmax" || moe_router_score_function == "sigmoid",
             "--moe-router-score-function '", moe_router_score_function,
             "' is not one of: softmax, sigmoid");
  const std::string& lb = moe_router_load_balancing_type;
  MG_REQUIRE(lb == "aux_loss" || lb == "none" || lb == "seq_aux_loss" || lb == "global_aux_loss" ||
                 lb == "sinkhorn",
             "--moe-router-load-balancing-type '", lb,
             "' is not one of: aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, none");
  MG_REQUIRE(lb != "sinkhorn" || moe_aux_loss_coeff == 0, "--moe-router-load-balancing-type "
             "sinkhorn balances by the Sinkhorn choice and takes no auxiliary loss (as in "
             "Megatron-Core); drop --moe-aux-loss-coeff ", moe_aux_loss_coeff);
  MG_REQUIRE(moe_aux_loss_coeff >= 0, "--moe-aux-loss-coeff must be >= 0");
  MG_REQUIRE(moe_z_loss_coeff >= 0, "--moe-z-loss-coeff must be >= 0");
  MG_REQUIRE(moe_router_topk_scaling_factor >= 0, "--moe-router-topk-scaling-factor must be > 0");
  if (moe_router_num_groups > 0 || moe_router_group_topk > 0) {
    const int G = moe_router_num_groups, g = moe_router_group_topk;
    MG_REQUIRE(G > 0 && g > 0, "group-limited routing needs both --moe-router-num-groups and "
               "--moe-router-group-topk");
    MG_REQUIRE(E % G == 0, "--num-experts ", E, " is not divisible by --moe-router-num-groups ", G);
    MG_REQUIRE(g <= G, "--moe-router-group-topk ", g, " must be <= --moe-router-num-groups ", G);
    MG_REQUIRE(moe_router_topk % g == 0, "--moe-router-topk ", moe_router_topk,
               " is not divisible by --moe-router-group-topk ", g,
               " (each selected group contributes topk/group-topk scores)");
    MG_REQUIRE(moe_router_topk / g <= E / G, "--moe-router-topk / --moe-router-group-topk = ",
               moe_router_topk / g, " exceeds the ", E / G, " experts of a group");
    MG_REQUIRE(moe_router_topk <= g * (E / G), "--moe-router-topk ", moe_router_topk,
               " exceeds the experts of the ", g, " selected groups");
  }
  MG_REQUIRE(!moe_router_enable_expert_bias || moe_router_score_function == "sigmoid",
             "--moe-router-enable-expert-bias works with --moe-router-score-function sigmoid "
             "only (as in Megatron-Core)");
  MG_REQUIRE(moe_router_bias_update_rate >= 0, "--moe-router-bias-update-rate must be >= 0");
  MG_REQUIRE(moe_expert_capacity_factor >= 0, "--moe-expert-capacity-factor must be > 0");
  MG_REQUIRE(moe_token_drop_policy == "probs" || moe_token_drop_policy == "position",
             "--moe-token-drop-policy '", moe_token_drop_policy, "' is not one of: probs, position");
  MG_REQUIRE(!moe_pad_expert_input_to_capacity || moe_expert_capacity_factor > 0,
             "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  MG_REQUIRE(moe_shared_expert_intermediate_size >= 0,
             "--moe-shared-expert-intermediate-size must be > 0");
  MG_REQUIRE(!moe_shared_expert_gate || moe_shared_expert_intermediate_size > 0,
             "--moe-shared-expert-gate gates the shared expert; give it one with "
             "--moe-shared-expert-intermediate-size");
}

}  // namespace megatron::model
