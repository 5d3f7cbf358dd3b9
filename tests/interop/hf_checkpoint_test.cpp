// Hugging Face transformers folders (training/hf_checkpoint.h), checked against an independent
// PyTorch reader (tests/interop/hf_reference.py: safetensors parsed by hand, GPT2LMHeadModel and
// LlamaForCausalLM forward passes as transformers defines them):
//   - a GPT-2 and a Llama-style (GQA, SwiGLU, RMSNorm, rotary, untied, no biases) checkpoint,
//     trained a few steps and resharded to TP2 x PP2 (the Llama one with virtual stages),
//     exported with `megatron checkpoint convert --save-format hf`: the reference's log-probs of
//     prompt + greedy continuation equal `megatron generate`'s on the TP2 x PP2 checkpoint within
//     1e-4; the bf16 export holds exactly the fp32 weights rounded to bf16 and its log-probs stay
//     within bf16 rounding; a sharded export (--max-shard-size) reads back the same; the export
//     of the same weights as Megatron-LM's TP2 x PP2 .pt files is the same folder;
//   - import -> export is bit for bit (every tensor and config.json), and the import under
//     TP2 x PP2 (the Llama one with virtual stages) generates the same log-probs;
//   - the padded vocabulary is cut on export and padded by Megatron's rule on import;
//   - the tokenizer's files (a GPT-2 BPE) travel with the export and with the import;
//   - errors: settings transformers cannot express, missing or malformed config.json, an
//     unsupported model type or field, a missing, extra or misshapen tensor.
// Resuming training from an import under TP2 x PP2 is in tests/training/hf_import_training_test.cpp;
// exports of models trained under TP2 x PP2 (fp32, bf16, fp16) in hf_export_training_test.cpp there.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "interop/hf_reference_util.h"
#include "model/model_test_util.h"
#include "interop/checkpoint_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/hf_checkpoint.h"
#include "training/parallel_test_util.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;
using parallel_test::run_single;
using parallel_test::tiny_gpt_args;
using parallel_test::write_corpus;
using hf_test::expect_logprobs;
using hf_test::folder_tensors;
using hf_test::generate;
using hf_test::reference;
using hf_test::Reference;
using hf_test::tiny_gpt2_config;
using hf_test::tiny_gpt2_tensors;
using hf_test::write_folder;

TrainingArgs gpt2_args(const fs::path& dir) {
  TrainingArgs a = tiny_gpt_args(dir, 6);
  a.save_interval = 1000;
  return a;
}

TrainingArgs llama_args(const fs::path& dir) {
  TrainingArgs a = gpt2_args(dir);
  model::testing::make_llama_style(a.model);
  return a;
}

ConvertOptions options(const fs::path& load, const fs::path& save) {
  ConvertOptions o;
  o.load = load;
  o.save = save;
  return o;
}

// Trains `a` for a few steps on one rank into dir/single and reshards it to TP2 x PP2 (with
// virtual stages of `vstage` layers) in dir/tp2pp2.
fs::path trained_tp2pp2(const fs::path& dir, TrainingArgs a, int vstage) {
  write_corpus((dir / "corpus").string());
  a.save = (dir / "single").string();
  run_single(a);
  ConvertOptions o = options(dir / "single", dir / "tp2pp2");
  o.target_tp = 2;
  o.target_pp = 2;
  o.target_layers_per_virtual_stage = vstage;
  const ConvertResult r = convert_checkpoint(o);
  EXPECT_EQ(r.to.tensor_model_parallel_size, 2);
  return dir / "tp2pp2";
}

using interop_testing::bit_equal;

void expect_same_folder(const fs::path& a, const fs::path& b) {
  const auto ta = folder_tensors(a), tb = folder_tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [n, t] : ta) {
    ASSERT_TRUE(tb.count(n)) << n;
    EXPECT_TRUE(bit_equal(t, tb.at(n))) << n;
  }
  EXPECT_EQ(json::parse(mt::read_file(a / "config.json")), json::parse(mt::read_file(b / "config.json")));
}

// The export, its bf16 and sharded twins, and the round trip, for one trained model.
void check_model(const fs::path& dir, const fs::path& ckpt, const std::string& type, size_t num_tensors) {
  const fs::path hf = dir / "hf";
  auto r = mt::run_cli("checkpoint convert --load " + ckpt.string() + " --save " + hf.string() +
                       " --save-format hf --print-checkpoint-structure");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(type == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(type == "gpt2" ? "transformer.wte.weight [64, 32] float32"
                                         : "model.embed_tokens.weight [64, 32] float32"),
            std::string::npos) << r.output;
  const json config = json::parse(mt::read_file(hf / "config.json"));
  EXPECT_EQ(config["model_type"], type);
  EXPECT_EQ(config["vocab_size"], 64);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["eos_token_id"], 63);  // NullTokenizer's EOD
  EXPECT_TRUE(fs::exists(hf / "generation_config.json"));
  EXPECT_TRUE(fs::exists(hf / "model.safetensors"));
  EXPECT_FALSE(fs::exists(hf / ".tmp_hf_export"));
  const auto tensors = folder_tensors(hf);
  EXPECT_EQ(tensors.size(), num_tensors);

  // bf16: the fp32 weights rounded, log-probs within bf16 rounding.
  r = mt::run_cli("checkpoint convert --load " + ckpt.string() + " --save " + (dir / "hf_bf16").string() +
                  " --save-format hf --target-params-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(mt::read_file(dir / "hf_bf16" / "config.json"))["torch_dtype"], "bfloat16");
  // Sharded: several files and an index, the same tensors.
  r = mt::run_cli("checkpoint convert --load " + ckpt.string() + " --save " + (dir / "hf_sharded").string() +
                  " --save-format hf --max-shard-size 20KB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir / "hf_sharded" / "model.safetensors"));
  const json index = json::parse(mt::read_file(dir / "hf_sharded" / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), num_tensors);
  std::set<std::string> files;
  for (const auto& [n, f] : index["weight_map"].items()) files.insert(f.get<std::string>());
  EXPECT_GT(files.size(), 2u);
  for (const std::string& f : files) {
    EXPECT_TRUE(f.starts_with("model-0000") && f.find("-of-0000" + std::to_string(files.size())) != std::string::npos) << f;
    EXPECT_LE(fs::file_size(dir / "hf_sharded" / f), 20'000u + 4096u) << f;  // data <= 20 KB + header
  }
  expect_same_folder(hf, dir / "hf_sharded");

  // The reference on all three against generate on the TP2 x PP2 checkpoint.
  const std::vector<json> gen = generate(ckpt);
  ASSERT_EQ(gen.size(), 2u);
  Reference ref = reference({hf, dir / "hf_bf16", dir / "hf_sharded"}, gen, dir, {{hf, dir / "hf_bf16"}});
  ASSERT_EQ(ref.logprobs.size(), 3u);
  expect_logprobs(gen, ref.logprobs[hf.string()], 1e-4, type + " fp32");
  expect_logprobs(gen, ref.logprobs[(dir / "hf_bf16").string()], 5e-2, type + " bf16");
  EXPECT_EQ(ref.rounded[(dir / "hf_bf16").string()], int64_t(num_tensors));
  EXPECT_EQ(ref.logprobs[(dir / "hf_sharded").string()], ref.logprobs[hf.string()]);

  // From Megatron-LM's .pt files of the same weights (TP2 x PP2): the same folder.
  ConvertOptions to_torch = options(dir / "single", dir / "megatron");
  to_torch.save_format = "torch";
  to_torch.target_tp = 2;
  to_torch.target_pp = 2;
  convert_checkpoint(to_torch);
  r = mt::run_cli("checkpoint convert --load " + (dir / "megatron").string() + " --save " +
                  (dir / "hf_from_pt").string() + " --save-format hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_folder(hf, dir / "hf_from_pt");

  // Import -> export bit for bit; the import under TP2 x PP2 generates the same log-probs.
  ConvertOptions in = options(hf, dir / "imported");
  in.load_format = "hf";
  in.make_vocab_size_divisible_by = 16;
  const ConvertResult ri = convert_checkpoint(in);
  EXPECT_EQ(ri.hf_model_type, type);
  EXPECT_EQ(ri.padded_vocab_to, 64);
  ConvertOptions back = options(dir / "imported", dir / "hf_again");
  back.save_format = "hf";
  convert_checkpoint(back);
  expect_same_folder(hf, dir / "hf_again");
  ConvertOptions in_par = in;
  in_par.save = dir / "imported_tp2pp2";
  in_par.target_tp = 2;
  in_par.target_pp = 2;
  in_par.target_layers_per_virtual_stage = type == "llama" ? 1 : 0;  // 2 chunks of 1 layer per rank
  const ConvertResult rp = convert_checkpoint(in_par);
  EXPECT_EQ(rp.to.tensor_model_parallel_size, 2);
  EXPECT_EQ(rp.to.pipeline_model_parallel_size, 2);
  EXPECT_TRUE(fs::exists(dir / "imported_tp2pp2" / "release" / "mp_rank_01_001" / "model.safetensors"));
  const std::vector<json> gen2 = generate(dir / "imported_tp2pp2");
  ASSERT_EQ(gen2.size(), gen.size());
  for (size_t s = 0; s < gen.size(); ++s) {
    EXPECT_EQ(gen2[s]["tokens"], gen[s]["tokens"]);
    expect_logprobs({gen2[s]}, {gen[s]["logprobs"].get<std::vector<double>>()}, 1e-5, type + " import");
  }
}

TEST(HfCheckpoint, Gpt2ExportMatchesTheReferenceAndRoundTrips) {
  mt::TempDir tmp;
  const fs::path ckpt = trained_tp2pp2(tmp.path(), gpt2_args(tmp.path()), 0);
  // wte, wpe, 12 per layer, ln_f (tied: no lm_head)
  check_model(tmp.path(), ckpt, "gpt2", 2 + 12 * 2 + 2);
}

TEST(HfCheckpoint, LlamaExportMatchesTheReferenceAndRoundTrips) {
  mt::TempDir tmp;
  const fs::path ckpt = trained_tp2pp2(tmp.path(), llama_args(tmp.path()), 1);
  // embed_tokens, 9 per layer, norm, lm_head (untied)
  check_model(tmp.path(), ckpt, "llama", 1 + 9 * 4 + 2);
  const json c = json::parse(mt::read_file(tmp / "hf" / "config.json"));
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["intermediate_size"], 48);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["rope_theta"], 10000.0);
}

// Less common settings each class expresses: GPT-2 with the exact GeLU, an FFN size other than 4h
// (n_inner), zero-centred norms (exported as 1 + w) and an untied output layer; Llama with biases
// on every linear layer, heads of kv-channels != h / n (head_dim) and another rotary base.
TEST(HfCheckpoint, OtherSettingsMatchTheReference) {
  mt::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs g = gpt2_args(tmp.path());
  g.model.activation = "gelu";
  g.model.ffn_hidden_size = 48;
  g.model.apply_layernorm_1p = true;
  g.model.untie_embeddings_and_output_weights = true;
  TrainingArgs l = llama_args(tmp.path());
  l.model.num_layers = 2;
  l.model.add_bias_linear = true;
  l.model.kv_channels = 16;
  l.model.rotary_base = 500000.0;
  std::vector<fs::path> folders;
  std::vector<std::vector<json>> gens;
  for (auto [name, a] : {std::pair{"gpt2", g}, std::pair{"llama", l}}) {
    a.train_iters = 2;
    a.lr_warmup_iters = 0;
    a.save = (tmp / name).string();
    run_single(a);
    const fs::path hf = tmp / (std::string(name) + "_hf");
    ConvertOptions o = options(tmp / name, hf);
    o.save_format = "hf";
    EXPECT_EQ(convert_checkpoint(o).hf_model_type, name);
    folders.push_back(hf);
    // The log-probs of the same sequences under both models (one reference process for both).
    gens.push_back(generate(tmp / name, 0, {"1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16", "9 8 7 3 5"}));
  }
  const json gc = json::parse(mt::read_file(folders[0] / "config.json"));
  EXPECT_EQ(gc["activation_function"], "gelu");
  EXPECT_EQ(gc["n_inner"], 48);
  EXPECT_EQ(gc["tie_word_embeddings"], false);
  const json lc = json::parse(mt::read_file(folders[1] / "config.json"));
  EXPECT_EQ(lc["attention_bias"], true);
  EXPECT_EQ(lc["head_dim"], 16);
  EXPECT_EQ(lc["rope_theta"], 500000.0);
  EXPECT_TRUE(folder_tensors(folders[1]).count("model.layers.1.mlp.down_proj.bias"));
  const Reference ref = reference(folders, gens[0], tmp.path());
  for (size_t i = 0; i < folders.size(); ++i) {
    ASSERT_EQ(gens[i][0]["tokens"], gens[0][0]["tokens"]);
    expect_logprobs(gens[i], ref.logprobs.at(folders[i].string()), 1e-4, folders[i].filename().string());
  }
}

TEST(HfCheckpoint, TheVocabularyIsCutOnExportAndPaddedOnImport) {
  mt::TempDir tmp;
  TrainingArgs a = gpt2_args(tmp.path());
  a.train_iters = 1;
  a.lr_warmup_iters = 0;
  a.make_vocab_size_divisible_by = 48;  // 64 tokens -> 96 rows
  write_corpus((tmp / "corpus").string());
  a.save = (tmp / "single").string();
  run_single(a);
  convert_checkpoint([&] {
    ConvertOptions o = options(tmp / "single", tmp / "hf");
    o.save_format = "hf";
    return o;
  }());
  const auto hf = folder_tensors(tmp / "hf");
  const MergedCheckpoint m = merge_checkpoint(*find_checkpoint(tmp / "single", std::nullopt), false);
  const Tensor& emb = m.model.at("embedding.word_embeddings.weight");
  ASSERT_EQ(emb.size(0), 96);
  EXPECT_TRUE(bit_equal(hf.at("transformer.wte.weight"), emb.narrow(0, 0, 64).contiguous()));
  EXPECT_EQ(json::parse(mt::read_file(tmp / "hf" / "config.json"))["vocab_size"], 64);
  // --true-vocab-size overrides the tokenizer's.
  ConvertOptions cut = options(tmp / "single", tmp / "hf60");
  cut.save_format = "hf";
  cut.true_vocab_size = 60;
  convert_checkpoint(cut);
  EXPECT_EQ(folder_tensors(tmp / "hf60").at("transformer.wte.weight").size(0), 60);
  // Import: Megatron's rule, 128 x T by default.
  ConvertOptions in = options(tmp / "hf", tmp / "tp2");
  in.load_format = "hf";
  in.target_tp = 2;
  EXPECT_EQ(convert_checkpoint(in).padded_vocab_to, 256);
  const CheckpointOnDisk c = *find_checkpoint(tmp / "tp2", std::nullopt);
  EXPECT_TRUE(c.release);
  const TrainingArgs args = training_args_from_json(c.state.args);
  EXPECT_EQ(args.model.padded_vocab_size, 256);
  EXPECT_EQ(args.tokenizer.type, "NullTokenizer");
  EXPECT_EQ(args.tokenizer.vocab_size, 64);
  const MergedCheckpoint mi = merge_checkpoint(c, false);
  EXPECT_EQ(mi.model.at("embedding.word_embeddings.weight").size(0), 256);
}

// A byte-level BPE vocabulary of GPT-2's format with no merges: the 256 byte symbols (GPT-2's
// byte-to-unicode map) and <|endoftext|> = 256.
void write_byte_bpe(const fs::path& vocab, const fs::path& merges) {
  json v = json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, char(cp));
    } else {
      utf8 = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    }
    v[utf8] = b;
  }
  v["<|endoftext|>"] = 256;
  mt::write_file(vocab, v.dump());
  mt::write_file(merges, "#version: 0.2\n");
}

TEST(HfCheckpoint, TokenizerFilesTravelWithTheExportAndTheImport) {
  mt::TempDir tmp;
  write_byte_bpe(tmp / "vocab.json", tmp / "merges.txt");
  const std::string bpe = " --tokenizer-type GPT2BPETokenizer --vocab-file " + (tmp / "vocab.json").string() +
                          " --merge-file " + (tmp / "merges.txt").string();
  TrainingArgs a = gpt2_args(tmp.path());
  a.train_iters = 1;
  a.lr_warmup_iters = 0;
  a.tokenizer.vocab_size = 257;  // the BPE's size: 272 rows
  write_corpus((tmp / "corpus").string());
  a.save = (tmp / "single").string();
  run_single(a);
  auto r = mt::run_cli("checkpoint convert --load " + (tmp / "single").string() + " --save " +
                       (tmp / "hf").string() + " --save-format hf" + bpe);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(mt::read_file(tmp / "hf" / "vocab.json"), mt::read_file(tmp / "vocab.json"));
  EXPECT_EQ(mt::read_file(tmp / "hf" / "merges.txt"), mt::read_file(tmp / "merges.txt"));
  EXPECT_EQ(json::parse(mt::read_file(tmp / "hf" / "tokenizer_config.json"))["tokenizer_class"], "GPT2Tokenizer");
  const json config = json::parse(mt::read_file(tmp / "hf" / "config.json"));
  EXPECT_EQ(config["vocab_size"], 257);
  EXPECT_EQ(config["bos_token_id"], 256);
  EXPECT_EQ(config["eos_token_id"], 256);
  EXPECT_EQ(json::parse(mt::read_file(tmp / "hf" / "generation_config.json"))["eos_token_id"], 256);
  // --true-vocab-size with the tokenizer flags: the files still travel.
  r = mt::run_cli("checkpoint convert --load " + (tmp / "single").string() + " --save " +
                  (tmp / "hf2").string() + " --save-format hf --true-vocab-size 257" + bpe);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(tmp / "hf2" / "merges.txt"));

  // The import records the tokenizer, its files copied next to the checkpoint.
  r = mt::run_cli("checkpoint convert --load " + (tmp / "hf").string() + " --load-format hf --save " +
                  (tmp / "imported").string() + " --make-vocab-size-divisible-by 16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("imported the Hugging Face gpt2 model"), std::string::npos) << r.output;
  const CheckpointOnDisk c = *find_checkpoint(tmp / "imported", std::nullopt);
  const TrainingArgs args = training_args_from_json(c.state.args);
  EXPECT_EQ(args.tokenizer.type, "GPT2BPETokenizer");
  EXPECT_EQ(args.tokenizer.vocab_file, (fs::absolute(tmp / "imported") / "vocab.json").string());
  EXPECT_EQ(mt::read_file(args.tokenizer.merge_file), mt::read_file(tmp / "merges.txt"));
  EXPECT_EQ(args.model.padded_vocab_size, 272);
  r = mt::run_cli("--log-level warn generate --load " + (tmp / "imported").string() +
                  " --use-checkpoint-args --tokenizer-type GPT2BPETokenizer --vocab-file " +
                  args.tokenizer.vocab_file + " --merge-file " + args.tokenizer.merge_file +
                  " --prompt 'ab' --num-tokens-to-generate 2 --top_k 1 --output-format jsonl");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(HfCheckpoint, ShardSizesParseAsTransformersDoes) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("500MB"), 500'000'000);
  EXPECT_EQ(parse_shard_size("2GiB"), int64_t(2) << 30);
  EXPECT_EQ(parse_shard_size("20kib"), 20 * 1024);
  EXPECT_EQ(parse_shard_size("10KB"), 10'000);
  EXPECT_EQ(parse_shard_size("8Mb"), 1'000'000);  // bits
  EXPECT_EQ(parse_shard_size("12345"), 12345);
  for (const char* bad : {"", "GB", "1.5GB", "-3MB", "0", "5 GB", "lots"}) {
    const std::string msg = mt::error_of([&] { parse_shard_size(bad); });
    EXPECT_NE(msg.find("--max-shard-size"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(HfCheckpoint, SettingsTransformersCannotExpressAreRefused) {
  model::TransformerConfig gpt2;
  gpt2.num_layers = 2, gpt2.hidden_size = 32, gpt2.num_attention_heads = 4;
  EXPECT_EQ(hf_model_type(gpt2), "gpt2");
  model::TransformerConfig llama = gpt2;
  llama.normalization = "RMSNorm", llama.activation = "swiglu", llama.position_embedding_type = "rope";
  llama.add_bias_linear = false, llama.num_query_groups = 2;
  EXPECT_EQ(hf_model_type(llama), "llama");
  auto refused = [](model::TransformerConfig c, auto change, const std::string& setting) {
    change(c);
    const std::string msg = mt::error_of([&] { hf_model_type(c); });
    EXPECT_NE(msg.find(setting), std::string::npos) << msg;
    EXPECT_NE(msg.find("cannot express"), std::string::npos) << msg;
  };
  using C = model::TransformerConfig;
  refused(gpt2, [](C& c) { c.position_embedding_type = "alibi"; }, "alibi");
  refused(gpt2, [](C& c) { c.position_embedding_type = "none"; }, "--position-embedding-type none");
  refused(gpt2, [](C& c) { c.window_left = 4; }, "--window-size");
  refused(gpt2, [](C& c) { c.qk_layernorm = true; }, "--qk-layernorm");
  refused(gpt2, [](C& c) { c.activation = "squared_relu"; }, "--squared-relu");
  refused(gpt2, [](C& c) { c.attention_mask_type = "bidirectional"; }, "bidirectional");
  refused(gpt2, [](C& c) { c.normalization = "RMSNorm"; }, "--normalization RMSNorm");
  refused(gpt2, [](C& c) { c.add_bias_linear = false; }, "--disable-bias-linear");
  refused(gpt2, [](C& c) { c.num_query_groups = 2; }, "--num-query-groups 2");
  refused(gpt2, [](C& c) { c.kv_channels = 16; }, "--kv-channels 16");
  refused(llama, [](C& c) { c.normalization = "LayerNorm"; }, "--normalization LayerNorm");
  refused(llama, [](C& c) { c.activation = "gelu"; }, "gelu");
  refused(llama, [](C& c) { c.rotary_interleaved = true; }, "--rotary-interleaved");
  refused(llama, [](C& c) { c.rotary_percent = 0.5f; }, "--rotary-percent");
  refused(llama, [](C& c) { c.add_qkv_bias = true; }, "--add-qkv-bias");
}

std::string import_error(const fs::path& folder, const fs::path& save) {
  return mt::error_of([&] {
    ConvertOptions o = options(folder, save);
    o.load_format = "hf";
    convert_checkpoint(o);
  });
}

TEST(HfCheckpoint, ImportErrorsNameTheFileAndTheTensorOrField) {
  mt::TempDir tmp;
  const fs::path good = write_folder(tmp / "good", tiny_gpt2_config(), tiny_gpt2_tensors());
  {  // the hand-made folder imports (the mask buffer skipped), and a tokenizer flag is recorded
    ConvertOptions o = options(good, tmp / "ok");
    o.load_format = "hf";
    const ConvertResult r = convert_checkpoint(o);
    EXPECT_EQ(r.padded_vocab_to, 128);
    ASSERT_FALSE(r.notes.empty());
    EXPECT_NE(r.notes[0].find("no tokenizer files"), std::string::npos) << r.notes[0];
  }
  fs::create_directories(tmp / "empty");
  std::string msg = import_error(tmp / "empty", tmp / "o1");
  EXPECT_NE(msg.find((tmp / "empty" / "config.json").string() + " is missing"), std::string::npos) << msg;

  write_folder(tmp / "malformed", tiny_gpt2_config(), tiny_gpt2_tensors());
  mt::write_file(tmp / "malformed" / "config.json", "{\"model_type\": \"gpt2\", ");
  msg = import_error(tmp / "malformed", tmp / "o2");
  EXPECT_NE(msg.find("config.json: malformed JSON"), std::string::npos) << msg;

  json bert = tiny_gpt2_config();
  bert["model_type"] = "bert";
  msg = import_error(write_folder(tmp / "bert", bert, tiny_gpt2_tensors()), tmp / "o3");
  EXPECT_NE(msg.find("\"model_type\" = \"bert\" is not supported"), std::string::npos) << msg;

  json no_layers = tiny_gpt2_config();
  no_layers.erase("n_layer");
  msg = import_error(write_folder(tmp / "nolayers", no_layers, tiny_gpt2_tensors()), tmp / "o4");
  EXPECT_NE(msg.find("config.json: missing \"n_layer\""), std::string::npos) << msg;

  json relu = tiny_gpt2_config();
  relu["activation_function"] = "relu";
  msg = import_error(write_folder(tmp / "relu", relu, tiny_gpt2_tensors()), tmp / "o5");
  EXPECT_NE(msg.find("\"activation_function\" = \"relu\" is not supported"), std::string::npos) << msg;

  auto without = [](const std::string& name) {
    auto t = tiny_gpt2_tensors();
    std::erase_if(t, [&](const auto& p) { return p.first == name; });
    return t;
  };
  msg = import_error(write_folder(tmp / "missing", tiny_gpt2_config(), without("transformer.h.0.mlp.c_fc.bias")),
                     tmp / "o6");
  EXPECT_NE(msg.find("tensor 'transformer.h.0.mlp.c_fc.bias' is missing"), std::string::npos) << msg;

  auto misshapen = tiny_gpt2_tensors();
  for (auto& [n, t] : misshapen)
    if (n == "transformer.h.0.attn.c_attn.weight") t = Tensor::zeros({24, 8}, DType::F32);  // [out, in]
  msg = import_error(write_folder(tmp / "shape", tiny_gpt2_config(), misshapen), tmp / "o7");
  EXPECT_NE(msg.find("model.safetensors: tensor 'transformer.h.0.attn.c_attn.weight' has shape [24, 8] "
                     "but config.json implies [8, 24]"),
            std::string::npos) << msg;

  auto extra = tiny_gpt2_tensors();
  extra.emplace_back("transformer.h.1.ln_1.weight", Tensor::zeros({8}, DType::F32));
  msg = import_error(write_folder(tmp / "extra", tiny_gpt2_config(), extra), tmp / "o8");
  EXPECT_NE(msg.find("unexpected tensor 'transformer.h.1.ln_1.weight'"), std::string::npos) << msg;

  fs::create_directories(tmp / "noweights");
  mt::write_file(tmp / "noweights" / "config.json", tiny_gpt2_config().dump());
  msg = import_error(tmp / "noweights", tmp / "o9");
  EXPECT_NE(msg.find("neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << msg;

  json llama = {{"model_type", "llama"}, {"hidden_size", 8}, {"intermediate_size", 16},
                {"num_hidden_layers", 1}, {"num_attention_heads", 2}, {"vocab_size", 10},
                {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}};
  msg = import_error(write_folder(tmp / "scaled", llama, tiny_gpt2_tensors()), tmp / "o10");
  EXPECT_NE(msg.find("\"rope_scaling\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("is not supported"), std::string::npos) << msg;
}

TEST(HfCheckpoint, CliErrorsNameTheSettingOrTheFlag) {
  mt::TempDir tmp;
  TrainingArgs a = gpt2_args(tmp.path());
  a.train_iters = 1;
  a.lr_warmup_iters = 0;
  a.model.activation = "squared_relu";
  write_corpus((tmp / "corpus").string());
  a.save = (tmp / "single").string();
  run_single(a);
  auto r = mt::run_cli("checkpoint convert --load " + (tmp / "single").string() + " --save " +
                       (tmp / "hf").string() + " --save-format hf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--squared-relu"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "hf" / "config.json"));
  r = mt::run_cli("checkpoint convert --load " + (tmp / "single").string() + " --save " +
                  (tmp / "hf2").string() + " --save-format hf --max-shard-size 5XB");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--max-shard-size '5XB'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron::training
