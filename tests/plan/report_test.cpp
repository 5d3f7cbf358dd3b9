// `megatron report` on the files of a real short run (pretrain-gpt with --log-metrics-jsonl,
// --tensorboard-dir and --save, built once per binary into the build tree's test cache):
//  - the numbers the page carries (its run-data block: the plots' series and the summary) are
//    the log's: every interval's loss, every validation and test loss, the last loss, the memory
//    lines, the checkpoints, the arguments;
//  - the TensorBoard reader agrees with the independent Python reader (tests/reference/
//    tfevents_reader.py) on every scalar;
//  - the unigram baseline of Megatron's mock documents equals NumPy's computation from the same
//    document lengths;
//  - a run still being written (a partial log line, JSONL line and event frame) is reported up
//    to its last complete record, as in progress;
//  - the page, rendered by headless Chromium, runs its script (every line plot wired, a zoom
//    opened from the location hash) and screenshots to a non-blank PNG;
//  - a missing run, a folder with nothing of a run and a damaged event file are errors naming them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "report/run_record.h"
#include "report/tfevents_reader.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;

const char* kRunFlags =
    " --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--max-position-embeddings 64"
    " --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --mock-data --tokenizer-type "
    "NullTokenizer"
    " --vocab-size 4100 --eval-iters 2 --eval-interval 10 --train-iters 30 --log-interval 2";

// The run, once per build of the binary (like the CLI fixture): train.log, metrics.jsonl, tb/,
// ckpt/.
const fs::path& run_dir() {
  static const fs::path dir = [] {
    const auto stamp = fs::last_write_time(cli_path()).time_since_epoch().count();
    const fs::path d =
        fs::path(MG_BINARY_DIR) / "test_cache" / ("report-run-" + std::to_string(stamp));
    if (!fs::exists(d / "train.log")) {
      const fs::path tmp = d.string() + ".tmp" + std::to_string(getpid());
      fs::remove_all(tmp);
      fs::create_directories(tmp);
      const CommandResult r =
          run_cli(std::string("pretrain-gpt") + kRunFlags + " --log-metrics-jsonl " +
                  (tmp / "metrics.jsonl").string() + " --tensorboard-dir " + (tmp / "tb").string() +
                  " --save " + (tmp / "ckpt").string() + " --save-interval 15 > " +
                  (tmp / "train.log").string() + " 2>&1");
      if (r.exit_code != 0)
        throw std::runtime_error("the report run failed:\n" + read_file(tmp / "train.log"));
      std::error_code ec;
      fs::rename(tmp, d, ec);
      if (ec) fs::remove_all(tmp);
    }
    return d;
  }();
  return dir;
}

nlohmann::json run_data(const fs::path& html) {
  const std::string page = read_file(html);
  const std::string open = "<script type=\"application/json\" id=\"run-data\">";
  const size_t a = page.find(open), b = page.find("</script>", a);
  EXPECT_NE(a, std::string::npos);
  return nlohmann::json::parse(page.substr(a + open.size(), b - a - open.size()));
}

// The values the log prints, by iteration.
struct LogValues {
  std::vector<std::pair<int64_t, double>> loss, valid, test;
  double max_allocated = 0;
};
LogValues log_values(const std::string& log) {
  LogValues v;
  const std::regex it(R"(iteration\s+(\d+)/\s*\d+ \|.*\| lm loss: (\S+) \|)"),
      ev(R"(validation loss at iteration (\d+)( on (validation|test) set)? \| lm loss value: (\S+) \|)"),
      mem(R"(max allocated: (\S+) \|)");
  std::smatch m;
  for (std::sregex_iterator i(log.begin(), log.end(), it), e; i != e; ++i)
    v.loss.push_back({std::stoll((*i)[1]), std::stod((*i)[2])});
  for (std::sregex_iterator i(log.begin(), log.end(), ev), e; i != e; ++i)
    ((*i)[3] == "test" ? v.test : v.valid).push_back({std::stoll((*i)[1]), std::stod((*i)[4])});
  if (std::regex_search(log, m, mem)) v.max_allocated = std::stod(m[1]);
  return v;
}

// The series of plot `id` named `name`: (x, y) pairs.
std::vector<std::pair<double, double>> series(const nlohmann::json& data, const std::string& id,
                                              const std::string& name) {
  for (const auto& s : data["plots"][id]["series"])
    if (s["name"] == name) {
      std::vector<std::pair<double, double>> out;
      for (size_t i = 0; i < s["x"].size(); ++i) out.push_back({s["x"][i], s["y"][i]});
      return out;
    }
  return {};
}

TEST(PlanReport, NumbersAreTheLogs) {
  TempDir out;
  const fs::path html = out / "r.html";
  CommandResult r = run_cli("report " + run_dir().string() + " --output " + html.string() +
                            " --peak-tflops 1 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("15 logged intervals, 5 evaluations"), std::string::npos) << r.output;
  const nlohmann::json d = run_data(html);
  const LogValues lv = log_values(read_file(run_dir() / "train.log"));
  ASSERT_EQ(lv.loss.size(), 15u);
  // The training loss is TensorBoard's per-iteration series (30 points); the logged intervals
  // are means over 2 iterations, so each equals the mean of its two points to the log's digits.
  const auto train = series(d, "loss", "training");
  ASSERT_EQ(train.size(), 30u);
  for (const auto& [iteration, loss] : lv.loss) {
    const double mean =
        (train[size_t(iteration - 2)].second + train[size_t(iteration - 1)].second) / 2;
    EXPECT_NEAR(mean, loss, 1e-6 * std::fabs(loss) + 2e-6)
        << "iteration " << iteration;  // float32 events
  }
  EXPECT_NEAR(d["summary"]["last_loss"].get<double>(), lv.loss.back().second,
              5e-7 * lv.loss.back().second);
  const auto valid = series(d, "loss", "validation"), test = series(d, "loss", "test");
  ASSERT_EQ(valid.size(), lv.valid.size());
  for (size_t i = 0; i < valid.size(); ++i) {
    EXPECT_EQ(valid[i].first, double(lv.valid[i].first));
    EXPECT_EQ(valid[i].second, lv.valid[i].second);
  }
  ASSERT_EQ(test.size(), 1u);
  EXPECT_EQ(test[0].second, lv.test[0].second);
  double best = 1e30;
  for (const auto& v : lv.valid) best = std::min(best, v.second);
  EXPECT_EQ(d["summary"]["best_validation_loss"].get<double>(), best);
  EXPECT_EQ(series(d, "memory", "max allocated").at(0).second, lv.max_allocated);
  EXPECT_EQ(d["summary"]["iterations"], 30);
  EXPECT_EQ(d["summary"]["status"], "finished");
  EXPECT_TRUE(d["summary"]["mfu"].is_number());
  const std::string page = read_file(html);
  for (const char* s : {"iter_0000015", "iter_0000030", "num_layers", "Training report:"})
    EXPECT_NE(page.find(s), std::string::npos) << s;
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg"));  // no other network URL
  EXPECT_EQ(page.find("https://"), std::string::npos);
}

TEST(PlanReport, EventReaderAgreesWithThePythonReader) {
  std::vector<fs::path> files;
  const auto scalars = report::read_event_dir(run_dir() / "tb", &files);
  ASSERT_EQ(files.size(), 1u);
  CommandResult py = run_command("/usr/bin/python3 " +
                                 (source_dir() / "tests/reference/tfevents_reader.py").string() +
                                 " " + files[0].string());
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const nlohmann::json ref = nlohmann::json::parse(py.output);
  size_t n = 0;
  std::map<std::string, size_t> at;
  for (const auto& s : ref["scalars"]) {
    const std::string tag = s["tag"];
    const auto& mine = scalars.at(tag);
    const size_t i = at[tag]++;
    ASSERT_LT(i, mine.size()) << tag;
    EXPECT_EQ(mine[i].step, s["step"].get<int64_t>()) << tag;
    EXPECT_EQ(mine[i].value, s["value"].get<double>()) << tag;
    ++n;
  }
  size_t total = 0;
  for (const auto& [tag, v] : scalars) total += v.size();
  EXPECT_EQ(total, n);
}

TEST(PlanReport, UnigramBaselineOfMockDataMatchesNumpy) {
  CommandResult py = run_command(
      "/usr/bin/python3 -c \"import numpy as np; L = np.random.default_rng(seed=0).integers(low=1, "
      "high=4096, "
      "size=100000); c = np.array([np.sum(L >= t + 1) for t in range(1, 4095)] + [len(L)], "
      "dtype=np.float64); "
      "p = c[c > 0] / c.sum(); print(repr(float(-(p * np.log(p)).sum())))\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const nlohmann::json d = [&] {
    TempDir out;
    CommandResult r = run_cli("report " + run_dir().string() + " --output " +
                              (out / "r.html").string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return run_data(out / "r.html");
  }();
  EXPECT_NEAR(d["summary"]["unigram_loss"].get<double>(), std::stod(py.output), 1e-9);
}

TEST(PlanReport, ARunStillBeingWrittenIsReportedUpToItsLastCompleteRecord) {
  TempDir run;
  // Each file cut inside the record of iteration 14: the log line, the JSONL line, and an event
  // frame half-way through the TensorBoard file.
  const std::string log = read_file(run_dir() / "train.log");
  const size_t line14 = log.find("iteration       14/");
  ASSERT_NE(line14, std::string::npos);
  write_file(run / "train.log", log.substr(0, line14 + 30));
  const std::string jsonl = read_file(run_dir() / "metrics.jsonl");
  const size_t json14 = jsonl.find("{\"iteration\": 14,");
  ASSERT_NE(json14, std::string::npos);
  write_file(run / "metrics.jsonl", jsonl.substr(0, json14 + 20));
  std::vector<fs::path> files;
  report::read_event_dir(run_dir() / "tb", &files);
  const std::string events = read_file(files.at(0));
  fs::create_directories(run / "tb");
  write_file(run / "tb" / files[0].filename(), events.substr(0, events.size() / 2 + 3));
  CommandResult r = run_cli("report " + run.path().string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json d = run_data(run / "report.html");
  EXPECT_EQ(d["summary"]["iterations"], 12);  // the last complete interval line
  EXPECT_NE(d["summary"]["status"].get<std::string>().find("in progress"), std::string::npos);
  EXPECT_FALSE(series(d, "loss", "training").empty());
}

TEST(PlanReport, ChromiumRendersThePageAndItsScript) {
  TempDir out;
  const fs::path html = out / "report.html";
  ASSERT_EQ(
      run_cli("report " + run_dir().string() + " --output " + html.string() + " 2>&1").exit_code,
      0);
  const std::string chromium =
      "chromium --headless --no-sandbox --disable-gpu --disable-background-networking "
      "--disable-component-update --disable-sync --no-first-run --user-data-dir=" +
      (out / "profile").string();
  const std::string url = "'file://" + html.string() + "#zoom=loss:5:10'";
  CommandResult dom =
      run_command("timeout 120 " + chromium + " --dump-dom " + url + " 2>/dev/null");
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  EXPECT_NE(dom.output.find("<body data-interactive=\"7\">"), std::string::npos)
      << dom.output.substr(0, 2000);
  EXPECT_NE(dom.output.find("<figure data-plot=\"loss\" data-from=\"5\" data-to=\"10\">"),
            std::string::npos);
  const fs::path png = out / "shot.png";
  CommandResult shot =
      run_command("timeout 120 " + chromium +
                  " --window-size=1280,1800 --screenshot=" + png.string() + " " + url + " 2>&1");
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  // A PNG of the window's size with the plots' colours in it (tests/reference/png_colours.py).
  CommandResult check =
      run_command("/usr/bin/python3 " + (source_dir() / "tests/reference/png_colours.py").string() +
                  " " + png.string());
  ASSERT_EQ(check.exit_code, 0) << check.output;
  int w = 0, h = 0, colours = 0;
  double drawn = 0;
  ASSERT_EQ(std::sscanf(check.output.c_str(), "%d %d %d %lf", &w, &h, &colours, &drawn), 4)
      << check.output;
  EXPECT_EQ(w, 1280);
  EXPECT_EQ(h, 1800);
  EXPECT_GT(colours, 20) << "a blank page";
  EXPECT_GT(drawn, 0.02) << "a blank page";
}

// Megatron-LM's own log lines (fields this build does not print, a partial last line).
TEST(PlanReport, ReadsMegatronLmLogs) {
  report::RunRecord r;
  report::parse_log(
      "------------------------ arguments ------------------------\n"
      "  hidden_size ..................................... 4096\n"
      "  tensorboard_dir ................................. None\n"
      "-------------------- end of arguments ---------------------\n"
      " [2024-05-01 10:00:00] iteration      100/  500000 | consumed samples:        51200 | "
      "elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 180.3 | "
      "learning rate: 1.500000E-04 | global batch size:   512 | lm loss: 7.123456E+00 | "
      "loss scale: 1.0 | grad norm: 1.234 | num zeros: 0.0 | params norm: 250.1 | "
      "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
      "[Rank 0] (after 100 iterations) memory (MB) | allocated: 1.5e+04 | max allocated: 20000.5 | "
      "reserved: 21000.0 | max reserved: 21000.0\n"
      " validation loss at iteration 1000 | lm loss value: 6.500000E+00 | lm loss PPL: 6.651416E+02 | \n"
      " [2024-05-01 10:00:02] iteration      110/  500000 | consumed sam",
      r);
  ASSERT_EQ(r.intervals.size(), 1u);
  const report::Interval& iv = r.intervals[0];
  EXPECT_EQ(iv.iteration, 100);
  EXPECT_EQ(iv.train_iters, 500000);
  EXPECT_EQ(iv.consumed_samples, 51200);
  EXPECT_EQ(*iv.tflops_per_device, 180.3);
  EXPECT_EQ(iv.lm_loss, 7.123456);
  EXPECT_EQ(*iv.grad_norm, 1.234);
  EXPECT_EQ(iv.global_batch_size, 512);
  ASSERT_EQ(r.memory.size(), 1u);
  EXPECT_EQ(r.memory[0].max_allocated, 20000.5);
  EXPECT_EQ(r.memory[0].allocated, 15000.0);
  ASSERT_EQ(r.evaluations.size(), 1u);
  EXPECT_EQ(r.evaluations[0].loss, 6.5);
  EXPECT_EQ(r.argument("hidden_size").value_or(""), "4096");
}

TEST(PlanReport, ErrorsNameTheRun) {
  TempDir d;
  CommandResult missing = run_cli("report " + (d / "nope").string() + " 2>&1");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos) << missing.output;
  CommandResult empty = run_cli("report " + d.path().string() + " 2>&1");
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.output.find("holds no training log"), std::string::npos) << empty.output;
  fs::create_directories(d / "tb");
  write_file(d / "tb" / "events.out.tfevents.1.host", std::string(40, 'x'));
  CommandResult damaged = run_cli("report " + d.path().string() + " 2>&1");
  EXPECT_EQ(damaged.exit_code, 1);
  EXPECT_NE(damaged.output.find("events.out.tfevents.1.host: the record at byte 0"),
            std::string::npos)
      << damaged.output;
}

}  // namespace
}  // namespace megatron::testing
