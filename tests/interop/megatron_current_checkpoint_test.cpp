// Checkpoints as current Megatron-LM writes them (tests/reference/megatron_current_checkpoint.py,
// from its checkpointing.py and validate_args): enum-valued arguments by value and by name, torch
// dtypes, NumPy scalars, a nested SimpleNamespace, Transformer Engine's extra-state encodings, the
// rerun state machine's OrderedDict / defaultdict / named-tuple keys, Transformer Engine's
// FusedAdam state. They load as plain data; the arguments round-trip through our pickler into
// torch.load unchanged; generate and checkpoint convert take the architecture from the folder's
// arguments; an argument of a newer release is a warning naming it, a model feature this build
// lacks an error naming it; files that would run code are refused and nothing runs. What we write
// back (both --transformer-impl) loads into Megatron-Core's module trees (strict) and optimizers.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/pickle.h"
#include "core/torch_file.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

std::string python(const std::string& script, const std::string& args) {
  const auto r = mt::run_command("/usr/bin/python3 " + (mt::source_dir() / "tests/reference" / script).string() +
                                 " " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

const fs::path& fixtures() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    python("megatron_current_checkpoint.py", "make " + dir.path().string());
    made = true;
  }
  return dir.path();
}

fs::path rank_file(const fs::path& folder, int iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07d", iteration);
  return folder / name / "mp_rank_00" / "model_optim_rng.pt";
}

TEST(MegatronCurrentCheckpoint, ArgumentsAndStateLoadAsPlainData) {
  const TorchFile f = TorchFile::open(rank_file(fixtures() / "current", 5));
  const Value& root = f.root();
  const Value* args = root.get("args");
  ASSERT_NE(args, nullptr);
  ASSERT_EQ(args->kind, Kind::Namespace);
  const Value* backend = args->get("attention_backend");  // AttnBackend(5)
  ASSERT_EQ(backend->kind, Kind::Enum);
  EXPECT_EQ(backend->text, "megatron.core.transformer.enums.AttnBackend");
  ASSERT_EQ(backend->items.size(), 1u);
  EXPECT_EQ(backend->items[0]->integer, 5);
  const Value* scope = args->get("inference_cuda_graph_scope");  // getattr(cls, 'none')
  ASSERT_EQ(scope->kind, Kind::Enum);
  EXPECT_EQ(scope->text, "megatron.core.transformer.enums.InferenceCudaGraphScope");
  EXPECT_EQ(scope->member, "none");
  const Value* scopes = args->get("cuda_graph_scope");
  ASSERT_EQ(scopes->kind, Kind::List);
  ASSERT_EQ(scopes->items.size(), 1u);
  EXPECT_EQ(scopes->items[0]->kind, Kind::Enum);
  EXPECT_EQ(args->get("params_dtype")->kind, Kind::TorchDType);
  EXPECT_EQ(args->get("params_dtype")->dtype, DType::BF16);
  EXPECT_EQ(args->get("exp_avg_sq_dtype")->dtype, DType::U8);
  EXPECT_EQ(args->get("min_lr")->kind, Kind::Float);  // numpy.float64
  EXPECT_DOUBLE_EQ(args->get("min_lr")->real, 3e-4);
  EXPECT_EQ(args->get("init_method_std")->kind, Kind::Float);  // numpy.float32
  const Value* nested = args->get("model_parallel");
  ASSERT_EQ(nested->kind, Kind::Namespace);
  EXPECT_EQ(nested->text, "types.SimpleNamespace");
  EXPECT_EQ(nested->get("tensor_model_parallel_size")->integer, 1);
  EXPECT_EQ(args->get("future_window_policy")->kind, Kind::Tuple);
  // Transformer Engine's extra state: None, io.BytesIO, a uint8 tensor, an empty one.
  std::map<Kind, int> extra;
  for (const auto& [k, v] : root.get("model")->entries)
    if (k->text.ends_with("._extra_state")) ++extra[v->kind];
  EXPECT_GT(extra[Kind::None], 0);
  EXPECT_GT(extra[Kind::Bytes], 0);
  EXPECT_GT(extra[Kind::Tensor], 0);
  const Value* rerun = root.get("rerun_state_machine");
  ASSERT_EQ(rerun->kind, Kind::Dict);
  EXPECT_TRUE(rerun->ordered);
  EXPECT_EQ(rerun->get("mode")->kind, Kind::Enum);
  EXPECT_EQ(rerun->get("validation_counts")->entries.size(), 1u);
  EXPECT_EQ(rerun->get("validation_counts")->entries[0].first->kind, Kind::Tuple);
  EXPECT_EQ(root.get("num_floating_point_operations_so_far")->kind, Kind::Float);
}

TEST(MegatronCurrentCheckpoint, ArgumentsRoundTripIntoTorchLoad) {
  const fs::path file = rank_file(fixtures() / "current", 5);
  const TorchFile f = TorchFile::open(file);
  pickle::Document doc;
  Value* root = doc.dict();
  doc.root = root;
  pickle::Document::set(root, doc.str("args"), const_cast<Value*>(f.root().get("args")));
  const fs::path ours = fixtures() / "ours_args.pt";
  write_torch_file(ours, *root, "ours_args");
  EXPECT_EQ(python("megatron_current_checkpoint.py", "args " + file.string() + " " + ours.string()),
            "same\n");
}

TEST(MegatronCurrentCheckpoint, GenerateAndConvertTakeTheArchitectureFromTheArgs) {
  const fs::path dir = fixtures() / "current";
  mt::TempDir out;
  const std::string tok = " --tokenizer-type NullTokenizer --vocab-size 60";
  const auto converted = mt::run_cli("checkpoint convert --load " + dir.string() + " --save " +
                                     (out / "ours").string() + " 2>&1");
  ASSERT_EQ(converted.exit_code, 0) << converted.output;
  // A newer release's arguments are named in one warning, not refused.
  EXPECT_NE(converted.output.find("future_knob"), std::string::npos) << converted.output;
  EXPECT_NE(converted.output.find("warning"), std::string::npos) << converted.output;
  const json meta = json::parse(mt::read_file(out / "ours" / "iter_0000005" / "metadata.json"));
  EXPECT_EQ(meta["args"]["model"]["num_layers"], 4);
  EXPECT_EQ(meta["args"]["model"]["hidden_size"], 32);
  const std::string gen = " --prompt '1 2 3 4 5' --num-tokens-to-generate 4 --top_k 1"
                          " --return-log-probs --output-format jsonl" + tok;
  const auto theirs = mt::run_cli("generate --load " + dir.string() + " --use-checkpoint-args" + gen);
  const auto mine = mt::run_cli("generate --load " + (out / "ours").string() + " --use-checkpoint-args" + gen);
  ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
  ASSERT_EQ(mine.exit_code, 0) << mine.output;
  auto results = [](const std::string& out) { return out.substr(std::min(out.find("\n{"), out.size())); };
  EXPECT_NE(results(theirs.output).find("\"logprobs\""), std::string::npos) << theirs.output;
  EXPECT_EQ(results(theirs.output), results(mine.output));
}

TEST(MegatronCurrentCheckpoint, AModelFeatureThisBuildLacksIsRefusedByName) {
  const auto r = mt::run_cli("checkpoint convert --load " + (fixtures() / "mla").string() + " --save " +
                             (fixtures() / "never").string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("multi_latent_attention = True (--multi-latent-attention)"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(fixtures() / "never"));
}

TEST(MegatronCurrentCheckpoint, FilesThatWouldRunCodeAreRefusedAndNothingRuns) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // (protocol 2 spells subprocess.Popen and builtins.exec as Python 2 did)
      {"partial", "'functools.partial'"}, {"popen", ".Popen'"},
      {"exec", "builtin__.exec'"}, {"megatron_function", "'megatron.core.utils.run_command'"},
      {"enum_then_system", "'posix.system'"}};
  for (const auto& [name, global] : cases) {
    const fs::path file = rank_file(fixtures() / ("evil_" + name), 1);
    const std::string msg = mt::error_of([&] { TorchFile::open(file); });
    EXPECT_NE(msg.find(global), std::string::npos) << name << ": " << msg;
    EXPECT_NE(msg.find("nothing was executed"), std::string::npos) << msg;
    const auto r = mt::run_cli("checkpoint convert --load " + (fixtures() / ("evil_" + name)).string() +
                               " --save " + (fixtures() / "never").string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << r.output;
  }
  EXPECT_FALSE(fs::exists(fixtures() / "MARKER"));
}

// Hand-written pickles of what torch 1.13 cannot write: a float8 dtype as an argument (a plain
// value), but not as a tensor storage.
TEST(MegatronCurrentCheckpoint, NewerTorchDtypesAreValuesNotStorages) {
  using namespace std::string_literals;
  const std::string arg = "\x80\x02" "ctorch\nfloat8_e4m3fn\n."s;
  const pickle::Document d =
      pickle::unpickle({reinterpret_cast<const uint8_t*>(arg.data()), arg.size()}, "float8");
  ASSERT_EQ(d.root->kind, Kind::Enum);
  EXPECT_EQ(d.root->member, "float8_e4m3fn");
  const std::string storage = "\x80\x02(X\x07\0\0\0storagectorch\nfloat8_e4m3fn\n"s +
                              "X\x01\0\0\0"s + "0X\x03\0\0\0cpuK\x04tQ."s;
  const std::string msg = mt::error_of([&] {
    pickle::unpickle({reinterpret_cast<const uint8_t*>(storage.data()), storage.size()}, "float8 storage");
  });
  EXPECT_NE(msg.find("not a tensor storage"), std::string::npos) << msg;
}

}  // namespace
}  // namespace megatron
