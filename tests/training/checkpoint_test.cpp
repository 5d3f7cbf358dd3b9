// Checkpoint tests: the argument JSON, and `megatron pretrain-gpt --load` end to end:
// exact resume (split run == uninterrupted run, bit for bit, in fp32 with dropout, fp16 with a
// dynamic loss scaler that grows and skips, bf16, and SGD), --finetune, --no-load-optim, the LR
// schedule rules, corrupted or mismatched checkpoints (clean "error: ..." exits naming the file),
// and SIGTERM with --exit-signal-handler followed by a resume.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "model/model_settings.h"
#include "test_util.h"
#include "training/checkpoint.h"

extern char** environ;

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string file_bytes(const fs::path& p) { return testing::read_file(p); }

// ---------------------------------------------------------------------------------------------
// arguments

TEST(CheckpointArgs, JsonRoundTripKeepsEveryField) {
  TrainingArgs a;
  a.model.num_layers = 3;
  a.model.hidden_size = 48;
  a.model.hidden_dropout = 0.25f;
  a.model.params_dtype = DType::BF16;
  a.model.recompute_granularity = "full";
  a.tokenizer.type = "GPT2BPETokenizer";
  a.data.data_path = {"0.3", "a", "0.7", "b"};
  a.data.reset_attention_mask = true;
  a.optimizer.type = optim::OptimizerType::SGD;
  a.optimizer.clip_grad = 0.5;
  a.lr = 3e-4;
  a.seed = 99;
  a.bf16 = true;
  a.tensorboard.dir = "tb";
  a.load = "ckpt";
  a.no_load_rng = true;
  const json j = training_args_to_json(a);
  EXPECT_EQ(j["model"]["num_layers"], 3);
  EXPECT_EQ(j["model"]["params_dtype"], "bfloat16");
  EXPECT_EQ(j["optimizer"]["type"], "sgd");
  EXPECT_EQ(j["data"]["data_path"][3], "b");
  EXPECT_EQ(j["tensorboard"]["dir"], "tb");
  const TrainingArgs b = training_args_from_json(j);
  EXPECT_EQ(training_args_to_json(b), j);
  EXPECT_EQ(b.model.hidden_dropout, 0.25f);
  EXPECT_EQ(b.lr, 3e-4);
  EXPECT_TRUE(b.no_load_rng);
  // Missing fields keep their defaults (older or hand-written metadata).
  const TrainingArgs d = training_args_from_json(json{{"model", {{"num_layers", 5}}}});
  EXPECT_EQ(d.model.num_layers, 5);
  EXPECT_EQ(d.seed, 1234u);
  // ... except the activation: metadata without it was written by builds that trained the exact
  // (erf) GeLU, or recorded the form as "gelu_tanh"; every reader must agree with the resume check.
  EXPECT_EQ(model::TransformerConfig().activation, "gelu_tanh");  // today's default differs
  EXPECT_EQ(d.model.activation, "gelu");
  EXPECT_EQ(model::config_from_checkpoint_args(json{{"model", {{"num_layers", 5}}}}).config.activation,
            "gelu");
  for (bool tanh_form : {false, true}) {
    const json legacy{{"model", {{"num_layers", 5}, {"gelu_tanh", tanh_form}}}};
    const std::string want = tanh_form ? "gelu_tanh" : "gelu";
    EXPECT_EQ(training_args_from_json(legacy).model.activation, want);
    EXPECT_EQ(model::config_from_checkpoint_args(legacy).config.activation, want);
  }
}

// ---------------------------------------------------------------------------------------------
// pretrain-gpt --load

// 300 documents of 20..60 tokens (ids < 63, EOD 63) with a learnable structure.
std::string write_corpus(const testing::TempDir& dir) {
  const std::string prefix = (dir / "corpus").string();
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  for (int d = 0; d < 300; ++d) {
    std::vector<int32_t> doc;
    const int len = 20 + (d * 7) % 41, step = 1 + d % 7;
    for (int i = 0; i < len; ++i) doc.push_back((d * 3 + i * step) % 63);
    doc.push_back(63);
    b.add_item(doc);
    b.end_document();
  }
  b.finalize();
  return prefix;
}

struct Fixture {
  testing::TempDir dir;
  std::string prefix = write_corpus(dir);
  static constexpr const char* kSchedule =
      "--lr 2e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2";
  // Tiny model; dropout on (Megatron's default 0.1); eval every 3 iterations. A model flag in
  // `extra` replaces the default one.
  std::string flags(const std::string& extra, const std::string& schedule = kSchedule) const {
    std::string model;
    for (const char* flag : {"--num-layers 2", "--hidden-size 16", "--seq-length 16", "--vocab-size 64"})
      if (extra.find(std::string(flag).substr(0, std::string(flag).find(' ') + 1)) == std::string::npos)
        model += std::string(flag) + " ";
    return "pretrain-gpt " + model + "--num-attention-heads 2 --max-position-embeddings 16 "
           "--tokenizer-type NullTokenizer --make-vocab-size-divisible-by 8 --micro-batch-size 2 "
           "--global-batch-size 4 --data-path " + prefix + " --data-cache-path " +
           (dir / "cache").string() + " --split 90,10,0 --log-interval 1 --eval-interval 3 "
           "--eval-iters 1 " + schedule + " " + extra;
  }
  testing::CommandResult run(const std::string& extra, const std::string& schedule = kSchedule) const {
    return testing::run_cli(flags(extra, schedule));
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

// Log lines without the wall-clock parts: "iteration N/M | consumed samples | learning rate ...
// lm loss ... loss scale ... grad norm ... skipped ... nan", and validation lines.
std::map<int64_t, std::string> deterministic_lines(const std::string& output) {
  std::map<int64_t, std::string> out;
  static const std::regex it_re(R"(iteration +(\d+)/ *\d+ \| (consumed samples: +\d+) \| .*\| (learning rate: .*)$)");
  static const std::regex val_re(R"(validation loss at iteration (\d+) \| (.*)$)");
  std::istringstream in(output);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, it_re)) out[std::stoll(m[1])] += m[2].str() + " | " + m[3].str();
    if (std::regex_search(line, m, val_re)) out[std::stoll(m[1])] += " || validation " + m[2].str();
  }
  return out;
}

// JSONL records by iteration, without the timing fields.
std::map<int64_t, json> jsonl_records(const std::string& path) {
  std::map<int64_t, json> out;
  std::istringstream in(testing::read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    j.erase("ms_per_iteration");
    j.erase("tokens_per_second");
    out[j["iteration"].get<int64_t>()] = j;
  }
  return out;
}

fs::path ckpt_file(const std::string& ckpt, int64_t it, const std::string& name) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", (long long)it);
  return fs::path(ckpt) / buf / (name == "metadata.json" ? name : "mp_rank_00/" + name);
}

int64_t optimizer_step(const std::string& ckpt, int64_t it) {
  return *read_safetensors(ckpt_file(ckpt, it, "optimizer.safetensors"))
              .tensors.at("optimizer.step").data<int64_t>();
}

// Trains 8 iterations in one process, and 4 + 4 in two processes (the first stops with
// --exit-interval, which saves; the second resumes with --load). Iterations 5..8 must print the
// same losses, LR, loss scale, grad norm and validation loss, bit for bit (JSONL at 17 digits),
// and the final model and optimizer files must be byte-identical.
void expect_exact_resume(const std::string& precision) {
  Fixture f;
  const std::string full = f.path("full"), split = f.path("split");
  auto a = f.run(precision + " --train-iters 8 --save " + full + " --save-interval 100 "
                 "--log-metrics-jsonl " + f.path("full.jsonl"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b1 = f.run(precision + " --train-iters 8 --exit-interval 4 --save " + split +
                  " --save-interval 100 --log-metrics-jsonl " + f.path("b1.jsonl"));
  ASSERT_EQ(b1.exit_code, 0) << b1.output;
  EXPECT_EQ(testing::read_file(fs::path(split) / "latest_checkpointed_iteration.txt"), "4");
  auto b2 = f.run(precision + " --train-iters 8 --load " + split + " --save " + split +
                  " --save-interval 100 --log-metrics-jsonl " + f.path("b2.jsonl"));
  ASSERT_EQ(b2.exit_code, 0) << b2.output;
  EXPECT_NE(b2.output.find("successfully loaded checkpoint from " + split + " at iteration 4"),
            std::string::npos) << b2.output;
  EXPECT_EQ(b2.output.find("iteration        4/"), std::string::npos) << b2.output;

  const auto la = deterministic_lines(a.output), lb1 = deterministic_lines(b1.output),
             lb2 = deterministic_lines(b2.output);
  ASSERT_EQ(la.size(), 8u) << a.output;
  ASSERT_EQ(lb2.size(), 4u) << b2.output;
  for (int64_t it = 1; it <= 4; ++it) EXPECT_EQ(lb1.at(it), la.at(it)) << "iteration " << it;
  for (int64_t it = 5; it <= 8; ++it) EXPECT_EQ(lb2.at(it), la.at(it)) << "iteration " << it;
  EXPECT_NE(la.at(6).find("validation"), std::string::npos);  // eval after the split continues

  const auto ja = jsonl_records(f.path("full.jsonl")), jb = jsonl_records(f.path("b2.jsonl"));
  ASSERT_EQ(jb.size(), 4u);
  for (int64_t it = 5; it <= 8; ++it) EXPECT_EQ(jb.at(it).dump(), ja.at(it).dump()) << it;

  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(file_bytes(ckpt_file(split, 8, file)), file_bytes(ckpt_file(full, 8, file))) << file;
  EXPECT_EQ(optimizer_step(split, 8), optimizer_step(full, 8));
  const json ma = json::parse(file_bytes(ckpt_file(full, 8, "metadata.json")));
  const json mb = json::parse(file_bytes(ckpt_file(split, 8, "metadata.json")));
  for (const char* key : {"iteration", "consumed_train_samples", "consumed_valid_samples",
                          "grad_scaler", "opt_param_scheduler", "rng_state"})
    EXPECT_EQ(mb[key], ma[key]) << key;
}

TEST(CheckpointResume, ExactFp32WithDropout) { expect_exact_resume(""); }

TEST(CheckpointResume, ExactBf16) { expect_exact_resume("--bf16"); }

TEST(CheckpointResume, ExactSgdWithMomentum) { expect_exact_resume("--optimizer sgd --sgd-momentum 0.9"); }

// A loss scale of 2e39 overflows the fp32 gradients: iterations 1, 2 and 4 are skipped (the
// hysteresis runs out, the scale halves), the scale doubles after every 2 clean steps. The
// scaler's trackers must continue across the split after iteration 4.
const char* const kFp16Flags = "--fp16 --initial-loss-scale 2e39 --loss-scale-window 2 --hysteresis 2";

TEST(CheckpointResume, ExactFp16WithDynamicLossScaler) { expect_exact_resume(kFp16Flags); }

TEST(CheckpointResume, Fp16ScalerActuallySkipsAndGrows) {
  Fixture f;
  auto r = f.run(std::string(kFp16Flags) + " --train-iters 8 --log-metrics-jsonl " + f.path("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = jsonl_records(f.path("m.jsonl"));
  int skipped = 0;
  std::set<double> scales;
  for (const auto& [it, rec] : j) {
    skipped += rec["skipped_iterations"].get<int>();
    scales.insert(rec["loss_scale"].get<double>());
  }
  EXPECT_GE(skipped, 2) << r.output;
  EXPECT_LE(skipped, 5) << r.output;
  EXPECT_GE(scales.size(), 3u) << r.output;  // backoff and growth both happened
}

TEST(CheckpointResume, FinetuneLoadsWeightsOnly) {
  Fixture f;
  const std::string ck = f.path("ck"), ft = f.path("ft");
  ASSERT_EQ(f.run("--train-iters 20 --save " + ck + " --save-interval 100").exit_code, 0);
  const std::string no_warmup = "--lr 2e-3 --min-lr 1e-4 --lr-decay-style cosine";
  auto scratch = f.run("--train-iters 3", no_warmup);
  auto r = f.run("--train-iters 3 --load " + ck + " --finetune --save " + ft + " --save-interval 100",
                 no_warmup);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--finetune: weights only"), std::string::npos) << r.output;
  const auto ls = deterministic_lines(scratch.output), lf = deterministic_lines(r.output);
  ASSERT_EQ(lf.size(), 3u) << r.output;
  // Iteration 1 again, at consumed samples 4, with the fresh schedule's LR, but trained weights.
  EXPECT_NE(lf.at(1).find("consumed samples:            4"), std::string::npos) << lf.at(1);
  auto field = [](const std::string& line, const std::string& name) {
    const size_t p = line.find(name);
    return line.substr(p + name.size(), line.find(" |", p) - p - name.size());
  };
  EXPECT_EQ(field(lf.at(1), "learning rate: "), field(ls.at(1), "learning rate: "));
  EXPECT_LT(std::stod(field(lf.at(1), "lm loss: ")), std::stod(field(ls.at(1), "lm loss: ")) - 0.1)
      << scratch.output << r.output;
  const json meta = json::parse(file_bytes(ckpt_file(ft, 3, "metadata.json")));
  EXPECT_EQ(meta["iteration"], 3);
  EXPECT_EQ(meta["consumed_train_samples"], 12);
  EXPECT_EQ(optimizer_step(ft, 3), 3);
  // The model's tensors must still match.
  auto bad = f.run("--train-iters 3 --load " + ck + " --finetune --hidden-size 32");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("error: --hidden-size: the checkpoint"), std::string::npos) << bad.output;
}

TEST(CheckpointResume, NoLoadOptimKeepsIterationButRestartsOptimizerAndSchedule) {
  Fixture f;
  const std::string ck = f.path("ck"), out = f.path("out");
  const auto first = f.run("--train-iters 8 --exit-interval 4 --save " + ck + " --save-interval 100");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto exact = f.run("--train-iters 8 --load " + ck);
  auto r = f.run("--train-iters 8 --load " + ck + " --no-load-optim --save " + out +
                 " --save-interval 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--no-load-optim: optimizer, loss scaler and LR schedule start fresh"),
            std::string::npos) << r.output;
  const auto le = deterministic_lines(exact.output), lr = deterministic_lines(r.output);
  ASSERT_EQ(lr.size(), 4u) << r.output;
  // Same data (iteration 5 at 20 consumed samples, same first loss: same weights, same batch,
  // same dropout), fresh optimizer and schedule (warmup LR again) -> different later losses.
  EXPECT_NE(lr.at(5).find("consumed samples:           20"), std::string::npos) << lr.at(5);
  auto loss = [](const std::string& line) { return line.substr(line.find("lm loss: "), 22); };
  EXPECT_EQ(loss(lr.at(5)), loss(le.at(5)));
  EXPECT_NE(loss(lr.at(7)), loss(le.at(7)));
  // The logged rate is the schedule's after its step (Megatron's): a fresh schedule's first one.
  auto rate = [](const std::string& line) { return line.substr(line.find("learning rate: "), 27); };
  EXPECT_EQ(rate(lr.at(5)), rate(deterministic_lines(first.output).at(1)));
  EXPECT_NE(rate(lr.at(5)), rate(le.at(5)));
  EXPECT_EQ(optimizer_step(out, 8), 4);
  EXPECT_EQ(json::parse(file_bytes(ckpt_file(out, 8, "metadata.json")))["opt_param_scheduler"]["num_steps"], 16);
  // --no-load-rng: same weights and batch, dropout masks from --seed again -> another loss.
  auto norng = f.run("--train-iters 8 --load " + ck + " --no-load-rng");
  ASSERT_EQ(norng.exit_code, 0) << norng.output;
  EXPECT_NE(norng.output.find("--no-load-rng: RNG from --seed"), std::string::npos) << norng.output;
  EXPECT_NE(loss(deterministic_lines(norng.output).at(5)), loss(le.at(5)));
}

TEST(CheckpointResume, NoSaveOptimAndNoSaveRng) {
  Fixture f;
  const std::string ck = f.path("ck");
  ASSERT_EQ(f.run("--train-iters 8 --exit-interval 4 --save " + ck +
                  " --save-interval 100 --no-save-optim --no-save-rng").exit_code, 0);
  EXPECT_FALSE(fs::exists(ckpt_file(ck, 4, "optimizer.safetensors")));
  const json meta = json::parse(file_bytes(ckpt_file(ck, 4, "metadata.json")));
  EXPECT_TRUE(meta["optimizer"].is_null());
  EXPECT_TRUE(meta["rng_state"].is_null());
  auto r = f.run("--train-iters 8 --load " + ck);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("has no RNG state (saved with --no-save-rng); pass --no-load-rng"),
            std::string::npos) << r.output;
  r = f.run("--train-iters 8 --load " + ck + " --no-load-rng");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("has no optimizer state (saved with --no-save-optim) (pass --no-load-optim"),
            std::string::npos) << r.output;
  r = f.run("--train-iters 8 --load " + ck + " --no-load-rng --no-load-optim");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("iteration        5/       8"), std::string::npos) << r.output;
}

// --exit-duration-in-mins and --exit-interval stop early and save (with --save), as Megatron does.
TEST(CheckpointResume, EarlyExitsSave) {
  Fixture f;
  const std::string ck = f.path("ck");
  auto r = f.run("--train-iters 8 --exit-duration-in-mins 1e-9 --save " + ck + " --save-interval 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(--exit-duration-in-mins)"), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_file(fs::path(ck) / "latest_checkpointed_iteration.txt"), "1");
  r = f.run("--train-iters 8 --exit-interval 3 --load " + ck + " --save " + ck + " --save-interval 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::read_file(fs::path(ck) / "latest_checkpointed_iteration.txt"), "3");
  EXPECT_TRUE(fs::exists(ckpt_file(ck, 1, "model.safetensors")));
  EXPECT_TRUE(fs::exists(ckpt_file(ck, 3, "model.safetensors")));
}

TEST(CheckpointResume, SchedulerFlagsFollowMegatron) {
  Fixture f;
  const std::string ck = f.path("ck");
  const auto first = f.run("--train-iters 8 --exit-interval 4 --save " + ck + " --save-interval 100");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string other_lr = "--lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2";
  auto mismatch = f.run("--train-iters 8 --load " + ck, other_lr);
  EXPECT_EQ(mismatch.exit_code, 1);
  EXPECT_NE(mismatch.output.find("error: --lr: the checkpoint's LR schedule has 0.002 but this run gives 0.001"),
            std::string::npos) << mismatch.output;
  EXPECT_NE(mismatch.output.find("--override-opt_param-scheduler"), std::string::npos);
  auto over = f.run("--train-iters 8 --load " + ck + " --override-opt_param-scheduler", other_lr);
  auto keep = f.run("--train-iters 8 --load " + ck + " --use-checkpoint-opt_param-scheduler", other_lr);
  auto same = f.run("--train-iters 8 --load " + ck);
  ASSERT_EQ(over.exit_code, 0) << over.output;
  ASSERT_EQ(keep.exit_code, 0) << keep.output;
  const auto lo = deterministic_lines(over.output), lk = deterministic_lines(keep.output),
             ls = deterministic_lines(same.output);
  EXPECT_EQ(lk.at(8), ls.at(8));  // checkpoint's schedule: identical to the plain resume
  EXPECT_NE(lo.at(5), ls.at(5));  // this run's LR
  // --lr may be left out when the checkpoint's schedule is used.
  auto nolr = f.run("--train-iters 8 --load " + ck + " --use-checkpoint-opt_param-scheduler", "");
  ASSERT_EQ(nolr.exit_code, 0) << nolr.output;
  EXPECT_EQ(deterministic_lines(nolr.output).at(8), ls.at(8));
  auto both = f.run("--train-iters 8 --load " + ck + " --override-opt_param-scheduler "
                    "--use-checkpoint-opt_param-scheduler");
  EXPECT_NE(both.output.find("mutually exclusive"), std::string::npos) << both.output;
}

TEST(CheckpointResume, MissingFolderOrTrackerStartsFromScratch) {
  Fixture f;
  auto r = f.run("--train-iters 3 --load " + f.path("nothing"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("does not exist; no checkpoint is loaded and training starts from random"),
            std::string::npos) << r.output;
  fs::create_directories(f.dir / "empty");
  auto e = f.run("--train-iters 3 --load " + f.path("empty"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("has no latest_checkpointed_iteration.txt"), std::string::npos) << e.output;
  auto strict = f.run("--train-iters 3 --load " + f.path("empty") + " --exit-on-missing-checkpoint");
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  // --ckpt-step picks an older iteration; nothing to train when past --train-iters.
  const std::string ck = f.path("ck");
  ASSERT_EQ(f.run("--train-iters 4 --save " + ck + " --save-interval 2").exit_code, 0);
  auto step = f.run("--train-iters 4 --load " + ck + " --ckpt-step 2");
  EXPECT_NE(step.output.find("at iteration 2"), std::string::npos) << step.output;
  EXPECT_NE(step.output.find("iteration        3/       4"), std::string::npos) << step.output;
  auto done = f.run("--train-iters 4 --load " + ck);
  EXPECT_EQ(done.exit_code, 0);
  EXPECT_NE(done.output.find("nothing to train"), std::string::npos) << done.output;
  auto nostep = f.run("--train-iters 4 --load " + ck + " --ckpt-step 3");
  EXPECT_EQ(nostep.exit_code, 1);
  EXPECT_NE(nostep.output.find("iter_0000003 does not exist"), std::string::npos) << nostep.output;
}

// Rewrites metadata.json's size and checksum of a tampered file, as a buggy writer would leave
// it, so that the loader reaches the safetensors validation.
void refresh_checksum(const fs::path& iter_dir, const std::string& rel) {
  const fs::path meta = iter_dir / "metadata.json";
  json j = json::parse(testing::read_file(meta));
  j["files"][rel] = {{"bytes", fs::file_size(iter_dir / rel)}, {"sha256", sha256_file(iter_dir / rel)}};
  fs::permissions(meta, fs::perms::owner_write, fs::perm_options::add);
  testing::write_file(meta, j.dump(2));
  testing::write_file(iter_dir / "metadata.json.sha256", sha256_file(meta) + "  metadata.json\n");
}

TEST(CheckpointResume, CorruptedOrMismatchedCheckpointsAreCleanErrors) {
  Fixture f;
  const std::string good = f.path("good");
  ASSERT_EQ(f.run("--train-iters 8 --exit-interval 4 --save " + good + " --save-interval 100").exit_code, 0);
  int n = 0;
  // A fresh copy of the checkpoint, damaged by `damage`; the resume must fail with exit code 1
  // and an "error: ..." line containing every needle.
  auto expect_failure = [&](auto damage, std::vector<std::string> needles,
                            const std::string& extra = "") {
    const fs::path ck = f.dir / ("ck" + std::to_string(n++));
    fs::copy(good, ck, fs::copy_options::recursive);
    fs::permissions(ck, fs::perms::owner_all, fs::perm_options::add);
    for (const auto& e : fs::recursive_directory_iterator(ck))
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    damage(ck, ck / "iter_0000004");
    auto r = f.run("--train-iters 8 --load " + ck.string() + " " + extra);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    for (const auto& needle : needles) EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    return r;
  };
  const std::string model_rel = "mp_rank_00/model.safetensors";
  auto truncate = [&](const fs::path&, const fs::path& it) {
    fs::resize_file(it / model_rel, fs::file_size(it / model_rel) - 100);
  };
  expect_failure(truncate, {"model.safetensors has", "truncated"});
  expect_failure([&](const fs::path& c, const fs::path& it) { truncate(c, it); refresh_checksum(it, model_rel); },
                 {"model.safetensors: the file is truncated: tensor"});
  expect_failure([&](const fs::path&, const fs::path& it) {
    std::fstream s(it / model_rel, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(-7, std::ios::end);
    char c = 0;
    s.read(&c, 1);
    s.seekp(-7, std::ios::end);
    c = char(c ^ 0x10);
    s.write(&c, 1);
  }, {"model.safetensors: SHA-256 checksum mismatch (file is corrupted)"});
  auto huge_header = [&](const fs::path&, const fs::path& it) {
    std::fstream s(it / model_rel, std::ios::in | std::ios::out | std::ios::binary);
    const char len[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    s.write(len, 8);
  };
  expect_failure(huge_header, {"model.safetensors: SHA-256 checksum mismatch"});
  expect_failure([&](const fs::path& c, const fs::path& it) { huge_header(c, it); refresh_checksum(it, model_rel); },
                 {"model.safetensors: the header length field says 4294967296 bytes"});
  expect_failure([&](const fs::path&, const fs::path& it) {
    testing::write_file(it / "metadata.json", "{\"format_version\": 2, \"iteration\": ");
  }, {"metadata.json: SHA-256 checksum mismatch"});
  expect_failure([&](const fs::path&, const fs::path& it) {  // its checksum file updated too
    testing::write_file(it / "metadata.json", "{\"format_version\": 2, \"iteration\": ");
    testing::write_file(it / "metadata.json.sha256", sha256_file(it / "metadata.json") + "  metadata.json\n");
  }, {"metadata.json is not valid JSON"});
  expect_failure([&](const fs::path& c, const fs::path&) {
    testing::write_file(c / "latest_checkpointed_iteration.txt", "12abc\n");
  }, {"latest_checkpointed_iteration.txt: expected an iteration number or 'release', got '12abc'"});
  expect_failure([&](const fs::path& c, const fs::path&) {
    testing::write_file(c / "latest_checkpointed_iteration.txt", "7");
  }, {"names iter_0000007 but", "iter_0000007 does not exist"});
  expect_failure([&](const fs::path&, const fs::path& it) { fs::remove(it / "metadata.json"); },
                 {"incomplete checkpoint", "metadata.json is missing"});
  expect_failure([&](const fs::path&, const fs::path& it) {
    fs::remove(it / "mp_rank_00/optimizer.safetensors");
  }, {"optimizer.safetensors is missing", "--no-load-optim"});
  // ... and with --no-load-optim the same checkpoint resumes.
  {
    const fs::path ck = f.dir / "noopt";
    fs::copy(good, ck, fs::copy_options::recursive);
    fs::permissions(ck / "iter_0000004/mp_rank_00", fs::perms::owner_all, fs::perm_options::add);
    fs::remove(ck / "iter_0000004/mp_rank_00/optimizer.safetensors");
    auto r = f.run("--train-iters 8 --load " + ck.string() + " --no-load-optim");
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  auto none = [](const fs::path&, const fs::path&) {};
  expect_failure(none, {"error: --hidden-size: the checkpoint", "has 16 but this run gives 32"},
                 "--hidden-size 32");
  expect_failure(none, {"error: --num-layers: the checkpoint", "has 2 but this run gives 3"},
                 "--num-layers 3");
  expect_failure(none, {"error: --seq-length", "has 16 but this run gives 8"}, "--seq-length 8");
  expect_failure(none, {"error: parameter dtype (--fp16 / --bf16)", "has float32 but this run gives bfloat16"},
                 "--bf16");
  expect_failure(none, {"error: padded vocabulary size", "has 64 but this run gives 72"},
                 "--vocab-size 70");
  expect_failure(none, {"holds adam state but this run uses --optimizer sgd", "--no-load-optim"},
                 "--optimizer sgd");
}

// Starts `megatron <args>` with stdout/stderr to `log`; returns the pid.
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<std::string> all = {testing::cli_path().string()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(CheckpointResume, SigtermSavesAndTheRunResumesExactly) {
  Fixture f;
  const std::string ck = f.path("ck"), log = f.path("run.log");
  // A long run: the dataset index is built for 20000 iterations in every run below, so all three
  // see the same data order.
  const std::string base = f.flags("--train-iters 20000", "--lr 2e-3 --lr-decay-style constant");
  std::vector<std::string> args = split_words(base + " --exit-signal-handler --save " + ck +
                                              " --save-interval 100000");
  const pid_t pid = spawn_cli(args, log);
  ASSERT_GT(pid, 0);
  bool started = false;
  for (int i = 0; i < 1200 && !started; ++i) {  // up to 120 s for the index build and 3 iterations
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    started = testing::read_file(log).find("iteration        3/") != std::string::npos;
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string out = testing::read_file(log);
  ASSERT_TRUE(started) << out;
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("on a termination signal"), std::string::npos) << out;
  const int64_t stopped = std::stoll(testing::read_file(fs::path(ck) / "latest_checkpointed_iteration.txt"));
  EXPECT_GE(stopped, 3);
  EXPECT_LT(stopped, 20000);
  EXPECT_NE(out.find("saved checkpoint at iteration " + std::to_string(stopped)), std::string::npos) << out;
  const auto before = deterministic_lines(out);
  EXPECT_EQ(before.rbegin()->first, stopped);  // the interrupted iteration was finished

  const std::string stop_at = " --exit-interval " + std::to_string(stopped + 2);
  auto resumed = testing::run_cli(base + stop_at + " --load " + ck);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto straight = testing::run_cli(base + stop_at);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto lr = deterministic_lines(resumed.output), ls = deterministic_lines(straight.output);
  ASSERT_EQ(lr.size(), 2u) << resumed.output;
  for (int64_t it = stopped + 1; it <= stopped + 2; ++it) EXPECT_EQ(lr.at(it), ls.at(it)) << it;
  for (const auto& [it, line] : before) EXPECT_EQ(line, ls.at(it)) << it;
}

}  // namespace
}  // namespace megatron::training
