// BERT to and from Hugging Face transformers' MegatronBert (`checkpoint convert --save-format hf`,
// `--load-format hf`): the exported folder, run by an independent float64 forward of
// MegatronBertForPreTraining / ForMaskedLM as transformers defines it (tests/interop/hf_reference.py),
// gives our masked-LM and sentence-order logits (1e-4); folders come back bit for bit; what the
// classes cannot express is refused by name.
#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/bert_model.h"
#include "model/model_test_util.h"
#include "interop/checkpoint_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

constexpr int64_t kVocab = 60;  // the true vocabulary; the model pads it to 64

model::TransformerConfig bert(bool binary_head, bool untied) {
  model::TransformerConfig c = model::testing::tiny_config();
  c.padded_vocab_size = 64;
  c.model_family = "bert";
  c.attention_mask_type = "bidirectional";
  c.activation = "gelu";
  c.bert_binary_head = binary_head;
  c.untie_embeddings_and_output_weights = untied;
  return c;
}

void save(model::BertModel& m, const model::TransformerConfig& cfg, const fs::path& dir) {
  TrainingArgs a;
  a.model = cfg;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = kVocab;
  a.make_vocab_size_divisible_by = 16;
  CheckpointState st;
  st.iteration = 1;
  st.scheduler.max_lr = 1e-3;
  st.scheduler.lr_decay_steps = 10;
  st.args = training_args_to_json(a);
  save_checkpoint(dir, st, m.parameters(), nullptr);
}

ConvertResult convert(const fs::path& from, const fs::path& to, const std::string& save_format,
                      const std::string& load_format = "auto") {
  ConvertOptions o;
  o.load = from;
  o.save = to;
  o.save_format = save_format;
  o.load_format = load_format;
  o.true_vocab_size = kVocab;
  o.make_vocab_size_divisible_by = 16;
  return convert_checkpoint(o);
}

using interop_testing::bit_equal;

void export_and_compare(bool binary_head, bool untied) {
  SCOPED_TRACE(str("binary head ", binary_head, ", untied ", untied));
  mt::TempDir tmp;
  const model::TransformerConfig cfg = bert(binary_head, untied);
  model::BertModel m(cfg, 7, model::TensorParallel::none(), model::ContextParallel::none());
  model::testing::randomise(m, 11);
  const int64_t b = 2, s = cfg.seq_length, V = cfg.padded_vocab_size;
  model::Batch in = model::testing::random_inputs(b, s, kVocab, 3, false);
  std::vector<int32_t> types(size_t(b * s)), pad(size_t(b * s), 1), pos(size_t(b * s));
  for (int64_t i = 0; i < b * s; ++i) {
    pos[size_t(i)] = int32_t(i % s);
    types[size_t(i)] = binary_head && i % s >= s / 2 ? 1 : 0;
    if (i >= 2 * s - 3) pad[size_t(i)] = 0;  // the last 3 positions of sequence 1 are padding
  }
  in.position_ids = Tensor::from_vector(pos, {b, s});
  in.token_types = Tensor::from_vector(types, {b, s});
  in.padding_mask = Tensor::from_vector(pad, {b, s});
  const Tensor logits = m.forward_logits(in);
  const Tensor binary = binary_head ? m.forward_binary_logits(in) : Tensor();

  save(m, cfg, tmp / "ours");
  const ConvertResult r = convert(tmp / "ours", tmp / "hf", "hf");
  EXPECT_EQ(r.hf_model_type, "megatron-bert");
  const json config = json::parse(mt::read_file(tmp / "hf" / "config.json"));
  EXPECT_EQ(config["architectures"][0],
            binary_head ? "MegatronBertForPreTraining" : "MegatronBertForMaskedLM");
  EXPECT_EQ(config["hidden_act"], "gelu");

  json input;
  for (int64_t bi = 0; bi < b; ++bi) {
    json t = json::array(), ty = json::array(), am = json::array();
    for (int64_t i = 0; i < s; ++i) {
      t.push_back(in.tokens.data<int32_t>()[bi * s + i]);
      ty.push_back(types[size_t(bi * s + i)]);
      am.push_back(pad[size_t(bi * s + i)]);
    }
    input["tokens"].push_back(t);
    input["types"].push_back(ty);
    input["attention_mask"].push_back(am);
  }
  mt::write_file(tmp / "input.json", input.dump());
  const auto run = mt::run_command("/usr/bin/python3 " +
                                   (mt::source_dir() / "tests/interop/hf_reference.py").string() +
                                   " megatron-bert " + (tmp / "input.json").string() + " " +
                                   (tmp / "hf").string() + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json ref = json::parse(run.output);
  // Every unpadded position's logits over the true vocabulary (transformers leaves a padded
  // query row attending to every key; Megatron's mask gives it no key: those rows are padding).
  std::vector<float> got;
  std::vector<double> want;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < s; ++i) {
      if (!pad[size_t(bi * s + i)]) continue;
      for (int64_t v = 0; v < kVocab; ++v) {
        got.push_back(logits.data<float>()[(bi * s + i) * V + v]);
        want.push_back(ref["prediction_logits"][bi][i][v].get<double>());
      }
    }
  model::testing::expect_close_to_reference("masked-LM logits", got.data(), want.data(),
                                            int64_t(got.size()), 1e-4);
  if (binary_head) {
    std::vector<double> bref;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int c = 0; c < 2; ++c) bref.push_back(ref["seq_relationship_logits"][bi][c].get<double>());
    model::testing::expect_close_to_reference("sentence-order logits", binary.data<float>(),
                                              bref.data(), 2 * b, 1e-4);
  } else {
    EXPECT_TRUE(ref["seq_relationship_logits"].is_null());
  }

  // And back: every tensor as it was.
  convert(tmp / "hf", tmp / "back", "safetensors", "hf");
  const MergedCheckpoint back = merge_checkpoint(find_checkpoint(tmp / "back", std::nullopt).value(), false);
  const TrainingArgs a = training_args_from_json(back.metadata.at("args"));
  EXPECT_EQ(a.model.model_family, "bert");
  EXPECT_EQ(a.model.bert_binary_head, binary_head);
  const model::ParameterList params = m.parameters();
  EXPECT_EQ(back.model.size(), params.size());
  for (const model::Parameter* p : params) {
    auto it = back.model.find(p->name);
    ASSERT_NE(it, back.model.end()) << p->name;
    // The rows past the true vocabulary are padding: cut by the export, padded again by the import.
    const bool vocab_rows = p->padded_vocab;
    EXPECT_TRUE(vocab_rows ? bit_equal(it->second.narrow(0, 0, kVocab), p->value.narrow(0, 0, kVocab))
                           : bit_equal(it->second, p->value))
        << p->name;
  }
}

TEST(HfBert, ExportsAsMegatronBertAndComesBack) {
  export_and_compare(/*binary_head=*/true, /*untied=*/false);
  export_and_compare(/*binary_head=*/false, /*untied=*/true);
}

TEST(HfBert, RefusesWhatMegatronBertCannotExpress) {
  mt::TempDir tmp;
  model::TransformerConfig cfg = bert(true, false);
  cfg.activation = "gelu_tanh";  // Megatron's fused bias-GeLU, its default
  model::BertModel m(cfg, 7, model::TensorParallel::none(), model::ContextParallel::none());
  save(m, cfg, tmp / "ours");
  try {
    convert(tmp / "ours", tmp / "hf", "hf");
    ADD_FAILURE() << "a tanh-GeLU encoder was exported under one exact hidden_act";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-bias-gelu-fusion"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "hf" / "config.json"));

  // A masked-LM folder whose token-type table is not zero: our BERT has token types only with
  // the sentence-order head, so importing it would drop them.
  model::TransformerConfig plain = bert(false, false);
  model::BertModel pm(plain, 7, model::TensorParallel::none(), model::ContextParallel::none());
  model::testing::randomise(pm, 5);
  save(pm, plain, tmp / "plain");
  convert(tmp / "plain", tmp / "hf2", "hf");
  auto st = read_safetensors(tmp / "hf2" / "model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, t] : st.tensors) {
    if (name == "bert.embeddings.token_type_embeddings.weight") t = Tensor::full(t.shape(), 0.5, t.dtype());
    tensors.emplace_back(name, t);
  }
  write_safetensors(tmp / "hf2" / "model.safetensors", tensors, {{"format", "pt"}});
  try {
    convert(tmp / "hf2", tmp / "back", "safetensors", "hf");
    ADD_FAILURE() << "non-zero token types were imported into a BERT without them";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token-type"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron::training
