// TensorBoard event files: CRC-32C against published check values, the protobuf bytes of the
// worked example in tensorboard.h, and files read back by an independent standard-library
// Python reader (tests/reference/tfevents_reader.py: framing, both CRCs, protobuf decoding),
// including the scalars of a tiny `megatron pretrain-gpt` run checked against its JSONL metrics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"
#include "training/tensorboard.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(TensorBoard, Crc32cKnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the usual "123456789" check value.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0x00000000u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(char(i));
    descending.push_back(char(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  // Masking: rotate right by 15, add 0xa282ead8 (mod 2^32).
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789"), uint32_t(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

std::string hex(const std::string& bytes) {
  std::string out;
  char b[4];
  for (unsigned char ch : bytes) {
    std::snprintf(b, sizeof b, "%02x ", ch);
    out += b;
  }
  if (!out.empty()) out.pop_back();
  return out;
}

TEST(TensorBoard, WorkedExampleBytes) {
  const std::string e = encode_scalar_event("lm loss", 2.5f, 7, 1.5);
  EXPECT_EQ(hex(e),
            "09 00 00 00 00 00 00 f8 3f 10 07 2a 10 0a 0e 0a 07 6c 6d 20 6c 6f 73 73 15 00 00 20 40");
  // A negative step is a 10-byte varint (two's complement), as protobuf's int64.
  EXPECT_EQ(hex(encode_scalar_event("x", 0.0f, -1, 0.0)).substr(27, 32),
            "10 ff ff ff ff ff ff ff ff ff 01");
  const std::string f = tfrecord_frame(e);
  ASSERT_EQ(f.size(), 8 + 4 + e.size() + 4);
  EXPECT_EQ(hex(f.substr(0, 8)), "1d 00 00 00 00 00 00 00");
  uint32_t len_crc = 0, data_crc = 0;
  std::memcpy(&len_crc, f.data() + 8, 4);
  std::memcpy(&data_crc, f.data() + 12 + e.size(), 4);
  EXPECT_EQ(len_crc, masked_crc32c(f.substr(0, 8)));
  EXPECT_EQ(data_crc, masked_crc32c(e));
}

// Runs the Python reader on an event file; the parsed JSON, or an exit code/message.
testing::CommandResult read_events(const fs::path& file) {
  return testing::run_command("/usr/bin/python3 '" +
                              (testing::source_dir() / "tests/reference/tfevents_reader.py").string() +
                              "' '" + file.string() + "' 2>&1");
}

json read_events_json(const fs::path& file) {
  const auto r = read_events(file);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? json::parse(r.output) : json::object();
}

fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u) << dir;
  return files.empty() ? fs::path() : files[0];
}

TEST(TensorBoard, WriterFileReadsBackInIndependentReader) {
  testing::TempDir dir;
  const fs::path logdir = dir / "tb" / "run1";  // created, parents included
  fs::path file;
  {
    EventFileWriter w(logdir, 1000);
    file = w.path();
    EXPECT_TRUE(std::regex_match(file.filename().string(),
                                 std::regex(R"(events\.out\.tfevents\.\d{10}\.[^/]+)")))
        << file;
    w.add_scalar("lm loss", 3.25, 1, 100.0);
    w.add_scalar("lm loss", 2.0, 2, 101.0);
    w.add_scalar("learning-rate vs samples", 1.5e-4, 64, 102.0);
    w.add_scalar("neg", -7.0, -3, 103.0);
    w.flush();
    // Flushed: a live reader sees every event while the writer is still open.
    const json live = read_events_json(file);
    EXPECT_EQ(live.value("records", 0), 5);
    w.add_scalar("after", 1.0, 9, 104.0);
    // A second writer in the same second gets its own file.
    EventFileWriter w2(logdir);
    EXPECT_NE(w2.path(), file);
  }
  const json j = read_events_json(file);
  EXPECT_EQ(j["file_version"], "brain.Event:2");
  ASSERT_EQ(j["scalars"].size(), 5u) << j.dump();
  const auto& s = j["scalars"];
  EXPECT_EQ(s[0]["tag"], "lm loss");
  EXPECT_EQ(s[0]["step"], 1);
  EXPECT_EQ(s[0]["value"].get<double>(), 3.25);
  EXPECT_EQ(s[0]["wall_time"].get<double>(), 100.0);
  EXPECT_EQ(s[1]["value"].get<double>(), 2.0);
  EXPECT_EQ(s[2]["tag"], "learning-rate vs samples");
  EXPECT_EQ(s[2]["step"], 64);
  EXPECT_EQ(s[2]["value"].get<double>(), double(1.5e-4f));  // simple_value is a float
  EXPECT_EQ(s[3]["step"], -3);
  EXPECT_EQ(s[3]["value"].get<double>(), -7.0);
  EXPECT_EQ(s[4]["tag"], "after");  // written by the destructor's flush

  // The reader really checks: a flipped byte in a payload is a CRC error.
  std::string bytes = testing::read_file(file);
  bytes[bytes.size() - 10] ^= 0x01;
  testing::write_file(dir / "corrupt", bytes);
  const auto bad = read_events(dir / "corrupt");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("data CRC mismatch"), std::string::npos) << bad.output;
  testing::write_file(dir / "truncated", testing::read_file(file).substr(0, 50));
  EXPECT_NE(read_events(dir / "truncated").exit_code, 0);
}

TEST(TensorBoard, UnwritableFolderIsAClearError) {
  testing::TempDir dir;
  testing::write_file(dir / "file", "x");
  try {
    EventFileWriter w(dir / "file" / "tb");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-dir"), std::string::npos) << e.what();
  }
}

std::string write_corpus(const testing::TempDir& dir) {
  const std::string prefix = (dir / "corpus").string();
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  for (int d = 0; d < 100; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < 30; ++i) doc.push_back((d + i * (1 + d % 3)) % 60);
    doc.push_back(63);
    b.add_item(doc);
    b.end_document();
  }
  b.finalize();
  return prefix;
}

// tag -> step -> value
using Scalars = std::map<std::string, std::map<int64_t, double>>;
Scalars by_tag(const json& j) {
  Scalars out;
  for (const auto& s : j["scalars"]) out[s["tag"]][s["step"].get<int64_t>()] = s["value"].get<double>();
  return out;
}

void expect_close(double got, double want, const std::string& what) {
  // JSONL values have 6 significant digits; TensorBoard's are floats.
  EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << what;
}

TEST(TensorBoard, PretrainGptScalarsMatchTheJsonlMetrics) {
  testing::TempDir dir;
  const std::string prefix = write_corpus(dir);
  const std::string common =
      "pretrain-gpt --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
      "--micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 2 "
      "--lr-decay-style cosine --min-lr 1e-4 --tokenizer-type NullTokenizer --vocab-size 64 "
      "--make-vocab-size-divisible-by 8 --data-path " + prefix + " --data-cache-path " +
      (dir / "cache").string() + " --split 90,10,0 --eval-iters 1 --eval-interval 3 --train-iters 6";
  const fs::path tb = dir / "tb";
  const auto r = testing::run_cli(
      common + " --log-interval 1 --log-metrics-jsonl " + (dir / "m.jsonl").string() +
      " --tensorboard-dir " + tb.string() + " --log-timers-to-tensorboard --log-throughput"
      " --log-batch-size-to-tensorboard --log-world-size-to-tensorboard"
      " --log-validation-ppl-to-tensorboard");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = read_events_json(only_event_file(tb));
  EXPECT_EQ(j["file_version"], "brain.Event:2");
  const Scalars got = by_tag(j);

  std::istringstream lines(testing::read_file(dir / "m.jsonl"));
  std::string line;
  int checked = 0;
  while (std::getline(lines, line)) {
    const json m = json::parse(line);
    const int64_t it = m["iteration"], samples = m["consumed_samples"];
    EXPECT_EQ(samples, it * 4);
    const std::string at = " at iteration " + std::to_string(it);
    for (const auto& [tag, key] : std::vector<std::pair<std::string, std::string>>{
             {"lm loss", "lm_loss"}, {"learning-rate", "learning_rate"},
             {"loss-scale", "loss_scale"}, {"grad-norm", "grad_norm"}}) {
      ASSERT_TRUE(got.count(tag) && got.at(tag).count(it)) << tag << at;
      ASSERT_TRUE(got.count(tag + " vs samples") && got.at(tag + " vs samples").count(samples))
          << tag << at;
      expect_close(got.at(tag).at(it), m[key].get<double>(), tag + at);
      EXPECT_EQ(got.at(tag).at(it), got.at(tag + " vs samples").at(samples)) << tag << at;
    }
    EXPECT_EQ(got.at("batch-size").at(it), 4.0);
    EXPECT_EQ(got.at("batch-size vs samples").at(samples), 4.0);
    EXPECT_EQ(got.at("world-size").at(it), 1.0);
    // iteration-time is in seconds where the JSONL has milliseconds.
    expect_close(got.at("iteration-time").at(it), m["ms_per_iteration"].get<double>() / 1000.0,
                 "iteration-time" + at);
    EXPECT_GT(got.at("throughput").at(it), 0.0);
    ++checked;
  }
  EXPECT_EQ(checked, 6);
  for (const auto& [tag, steps] : got) {
    if (tag.find("vs samples") != std::string::npos || tag.find("validation") != std::string::npos)
      continue;
    EXPECT_EQ(steps.size(), 6u) << tag;
  }

  // Validation at iterations 3 and 6, against the printed line.
  std::smatch v;
  std::string out = r.output;
  std::map<int64_t, double> printed;
  const std::regex vline(R"(validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+) \|)");
  while (std::regex_search(out, v, vline)) {
    printed[std::stoll(v[1])] = std::stod(v[2]);
    out = v.suffix();
  }
  ASSERT_EQ(printed.size(), 2u) << r.output;
  for (const auto& [it, loss] : printed) {
    const std::string at = " at iteration " + std::to_string(it);
    ASSERT_TRUE(got.count("lm loss validation") && got.at("lm loss validation").count(it)) << at;
    expect_close(got.at("lm loss validation").at(it), loss, "validation" + at);
    expect_close(got.at("lm loss validation vs samples").at(it * 4), loss, "validation vs samples" + at);
    expect_close(got.at("lm loss validation ppl").at(it), std::exp(loss), "ppl" + at);
    expect_close(got.at("lm loss validation ppl vs samples").at(it * 4), std::exp(loss), "ppl" + at);
  }

  // Defaults, --tensorboard-log-interval and the off switches.
  const fs::path tb2 = dir / "tb2";
  const auto r2 = testing::run_cli(common + " --log-interval 3 --tensorboard-dir " + tb2.string() +
                                   " --tensorboard-log-interval 2 --no-log-learnig-rate-to-tensorboard"
                                   " --no-log-loss-scale-to-tensorboard");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  const Scalars got2 = by_tag(read_events_json(only_event_file(tb2)));
  std::vector<std::string> tags;
  for (const auto& [tag, steps] : got2) tags.push_back(tag);
  EXPECT_EQ(tags, (std::vector<std::string>{"grad-norm", "grad-norm vs samples", "lm loss",
                                            "lm loss validation", "lm loss validation vs samples",
                                            "lm loss vs samples"}));
  EXPECT_EQ(got2.at("lm loss").size(), 3u);
  for (int64_t it : {2, 4, 6}) {
    EXPECT_TRUE(got2.at("lm loss").count(it)) << it;
    EXPECT_TRUE(got2.at("grad-norm vs samples").count(it * 4)) << it;
  }
  // Same data and seed: the same losses as the first run.
  for (const auto& [it, loss] : got2.at("lm loss")) EXPECT_EQ(loss, got.at("lm loss").at(it)) << it;

  const auto bad = testing::run_cli(common + " --tensorboard-dir " + tb2.string() +
                                    " --tensorboard-log-interval 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--tensorboard-log-interval"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace megatron::training
