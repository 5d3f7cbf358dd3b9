// GPTModel's forward pre-hook (what --overlap-param-gather waits for each parameter bucket from):
// in every forward (training, evaluation, logits) each parameter is handed to the hook exactly
// once, in forward order (embedding, layers from the first, final LayerNorm), before anything
// reads it. Checked by letting the hook "deliver" the parameter values, as an arriving all-gather
// does: a model whose parameters are garbage until the hook writes them must compute exactly what
// the model with the right values computes (bf16 parameters too, whose fp32 working copies must
// be refreshed after the hook, not before).
#include <gtest/gtest.h>

#include <map>

#include "model/gpt_model.h"
#include "model_test_util.h"

namespace megatron::model {
namespace {

struct Delivery {
  std::map<const Parameter*, Tensor> values;  // what the "gather" brings
  std::vector<std::string> order;
  int calls = 0;
};

// Overwrites every parameter with garbage and arms the hook to restore each one when asked for.
void arm(GPTModel& m, Delivery& d) {
  d.order.clear();
  d.calls = 0;
  for (Parameter* p : m.parameters()) {
    if (!d.values.count(p)) d.values[p] = p->value.clone();
    p->value.fill_(7.0);
  }
  m.set_forward_pre_hook([&d](const ParameterList& ps) {
    ++d.calls;
    for (Parameter* p : ps) {
      d.order.push_back(p->name);
      p->value.copy_(d.values.at(p));
    }
  });
}

void check_order(const Delivery& d, const GPTModel& m, size_t nparams) {
  ASSERT_EQ(d.order.size(), nparams);  // each parameter once
  EXPECT_EQ(d.order[0], "embedding.word_embeddings.weight");
  EXPECT_EQ(d.order[1], "embedding.position_embeddings.weight");
  EXPECT_EQ(d.order[2].rfind("decoder.layers.0.", 0), 0u) << d.order[2];
  EXPECT_EQ(d.order.back(), "decoder.final_layernorm.bias");
  EXPECT_EQ(d.calls, 2 + m.config().num_layers);  // embedding, each layer, final LayerNorm
}

void check(TransformerConfig cfg) {
  SCOPED_TRACE(std::string(dtype_name(cfg.params_dtype)) + " recompute '" +
               cfg.recompute_granularity + "'");
  GPTModel ref(cfg, 3), m(cfg, 3);
  testing::randomise(ref, 4);
  testing::randomise(m, 4);
  const size_t nparams = m.parameters().size();
  const Batch in = testing::random_inputs(2, cfg.seq_length, cfg.padded_vocab_size, 5, true);
  Delivery d;

  arm(m, d);
  const LossResult a = ref.forward_backward(in, 0.5f, 1);
  const LossResult b = m.forward_backward(in, 0.5f, 1);
  check_order(d, m, nparams);
  EXPECT_EQ(b.loss_sum, a.loss_sum);
  const ParameterList pr = ref.parameters(), pm = m.parameters();
  for (size_t i = 0; i < pr.size(); ++i)
    EXPECT_EQ(pm[i]->grad.to_float_vector(), pr[i]->grad.to_float_vector()) << pr[i]->name;

  arm(m, d);
  EXPECT_EQ(m.forward_loss(in).loss_sum, ref.forward_loss(in).loss_sum);
  check_order(d, m, nparams);

  arm(m, d);
  EXPECT_EQ(m.forward_logits(in.tokens, in.position_ids, in.attention_start).to_float_vector(),
            ref.forward_logits(in.tokens, in.position_ids, in.attention_start).to_float_vector());
  check_order(d, m, nparams);

  // Cleared: the values stay as they are (garbage here), nothing is called.
  m.set_forward_pre_hook({});
  for (Parameter* p : m.parameters()) p->value.fill_(7.0);
  d.calls = 0;
  m.forward_loss(in);
  EXPECT_EQ(d.calls, 0);
}

TEST(ForwardPreHook, EveryParameterArrivesBeforeItsModuleReadsIt) {
  check(testing::tiny_config());
  TransformerConfig bf16 = testing::tiny_config();
  bf16.params_dtype = DType::BF16;
  check(bf16);
  TransformerConfig full = testing::tiny_config();
  full.num_layers = 3;
  full.recompute_granularity = "full";
  full.recompute_method = "uniform";
  full.recompute_num_layers = 2;
  check(full);
}

}  // namespace
}  // namespace megatron::model
