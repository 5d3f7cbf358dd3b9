// Reading a run's files (run_record.h).
#include "report/run_record.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "training/checkpoint.h"
#include "training/run_log_lines.h"

namespace megatron::report {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MG_REQUIRE(in.good(), "cannot read ", p.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string trim(std::string s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::optional<double> number(const std::string& s) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    return used > 0 ? std::optional<double>(v) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "[2026-11-26 09:02:08.094895]" -> seconds since that day's midnight plus days since 1970.
std::optional<double> timestamp(const std::string& line) {
  int y, mo, d, h, mi;
  double sec;
  if (std::sscanf(line.c_str(), "[%d-%d-%d %d:%d:%lf]", &y, &mo, &d, &h, &mi, &sec) != 6)
    return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  const double days = double(timegm(&tm)) / 86400.0;
  return days * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
}

// One interval line: "iteration N/ T" then "key: value" fields between '|'.
bool parse_interval(const std::string& line, Interval& iv) {
  const size_t at = line.find(" iteration ");
  if (at == std::string::npos || line.find("consumed samples:") == std::string::npos) return false;
  long long it = 0, total = 0;
  if (std::sscanf(line.c_str() + at, " iteration %lld/ %lld", &it, &total) != 2) return false;
  iv.iteration = it;
  iv.train_iters = total;
  iv.seconds = timestamp(line);
  std::map<std::string, std::string> f;
  std::stringstream ss(line.substr(line.find('|', at) + 1));
  for (std::string seg; std::getline(ss, seg, '|');) {
    const size_t colon = seg.rfind(": ");
    if (colon != std::string::npos) f[trim(seg.substr(0, colon))] = trim(seg.substr(colon + 2));
  }
  auto get = [&](const char* k) { return f.count(k) ? number(f[k]) : std::nullopt; };
  iv.consumed_samples = int64_t(get("consumed samples").value_or(0));
  iv.ms_per_iteration = get("elapsed time per iteration (ms)").value_or(0);
  iv.tflops_per_device = get("throughput per GPU (TFLOP/s/GPU)");
  iv.tokens_per_second = get("tokens per second");
  iv.learning_rate = get("learning rate").value_or(0);
  iv.global_batch_size = int64_t(get("global batch size").value_or(0));
  iv.lm_loss = get("lm loss").value_or(std::nan(""));
  iv.loss_scale = get("loss scale").value_or(1);
  iv.grad_norm = get("grad norm");
  iv.skipped = int64_t(get("number of skipped iterations").value_or(0));
  iv.nan = int64_t(get("number of nan iterations").value_or(0));
  return true;
}

bool parse_evaluation(const std::string& line, Evaluation& e) {
  const size_t at = line.find("validation loss at ");
  const size_t v = line.find("lm loss value: ");
  if (at == std::string::npos || v == std::string::npos) return false;
  long long it = 0;
  if (std::sscanf(line.c_str() + at, "validation loss at iteration %lld", &it) != 1) return false;
  e.iteration = it;
  e.split = line.find(" on test set") != std::string::npos ? "test" : "validation";
  e.loss = number(line.substr(v + 15)).value_or(std::nan(""));
  const size_t p = line.find("lm loss PPL: ");
  e.ppl = p == std::string::npos ? std::exp(std::min(20.0, e.loss))
                                 : number(line.substr(p + 13)).value_or(0);
  return true;
}

const std::regex& memory_regex() {
  static const std::regex re(
      R"(\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: (\S+) \| )"
      R"(max allocated: (\S+) \| reserved: (\S+) \| max reserved: (\S+))");
  return re;
}

void read_checkpoints(const fs::path& dir, RunRecord& r) {
  std::error_code ec;
  if (!fs::exists(dir / "latest_checkpointed_iteration.txt", ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("iter_", 0) != 0) continue;
    Checkpoint c;
    c.iteration = std::stoll(name.substr(5));
    c.dir = e.path().string();
    for (const auto& f : fs::recursive_directory_iterator(e.path(), ec))
      if (f.is_regular_file()) c.bytes += double(f.file_size());
    const auto t = fs::last_write_time(e.path(), ec);
    const auto sys = std::chrono::file_clock::to_sys(t);
    const std::time_t tt = std::chrono::system_clock::to_time_t(sys);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&tt));
    c.saved = buf;
    r.checkpoints.push_back(c);
  }
  std::sort(r.checkpoints.begin(), r.checkpoints.end(),
            [](const Checkpoint& a, const Checkpoint& b) { return a.iteration < b.iteration; });
  // No arguments block in the log: the newest checkpoint's.
  if (r.arguments.empty()) {
    try {
      if (auto ck = training::find_checkpoint(dir, std::nullopt)) {
        const auto lines =
            training::format_arguments_block(training::training_args_from_json(ck->state.args));
        RunRecord tmp;
        std::string text;
        for (const auto& l : lines) text += l + "\n";
        parse_log(text, tmp);
        r.arguments = tmp.arguments;
      }
    } catch (const Error&) {
      // A checkpoint being written or of another format: the report goes on without it.
    }
  }
}

bool is_log_name(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".log" || e == ".txt" || e == ".out";
}

}  // namespace

std::optional<std::string> RunRecord::argument(const std::string& name) const {
  for (const auto& [k, v] : arguments)
    if (k == name) return v;
  return std::nullopt;
}

int64_t RunRecord::world_size() const {
  long long w = 0;
  const size_t at = layout.find("world ");
  if (at != std::string::npos && std::sscanf(layout.c_str() + at, "world %lld", &w) == 1 && w > 0)
    return w;
  return 1;
}

void parse_log(const std::string& text, RunRecord& r) {
  std::istringstream in(text);
  bool in_args = false;
  const bool complete = !text.empty() && text.back() == '\n';
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (!complete && !lines.empty()) lines.pop_back();  // still being written
  for (const std::string& line : lines) {
    if (line.find("------------------------ arguments ------------------------") !=
        std::string::npos) {
      in_args = true;
      r.arguments.clear();
      continue;
    }
    if (in_args) {
      if (line.find("end of arguments") != std::string::npos) {
        in_args = false;
        continue;
      }
      const std::string t = trim(line);
      const size_t dots = t.find(" .");
      if (dots == std::string::npos) continue;
      const size_t value = t.find_first_not_of('.', dots + 1);
      r.arguments.push_back(
          {t.substr(0, dots), value == std::string::npos ? "" : trim(t.substr(value))});
      continue;
    }
    Interval iv;
    if (parse_interval(line, iv)) {
      r.intervals.push_back(iv);
      continue;
    }
    Evaluation e;
    if (parse_evaluation(line, e)) {
      r.evaluations.push_back(e);
      continue;
    }
    std::smatch m;
    if (std::regex_search(line, m, memory_regex())) {
      r.memory.push_back({std::stoi(m[1]), std::stoll(m[2]), number(m[3]).value_or(0),
                          number(m[4]).value_or(0), number(m[5]).value_or(0),
                          number(m[6]).value_or(0)});
      continue;
    }
    if (line.rfind("parallel layout:", 0) == 0) r.layout = line;
    if (line.rfind("training finished:", 0) == 0 ||
        line.find("after training is done") != std::string::npos)
      r.finished = true;
  }
}

RunSources find_run_sources(const fs::path& run) {
  std::error_code ec;
  MG_REQUIRE(fs::exists(run, ec), "report: ", run.string(),
             " does not exist; give a run's folder "
             "or its log file");
  RunSources s;
  if (fs::is_regular_file(run, ec)) {
    s.logs.push_back(run);
    return s;
  }
  for (fs::recursive_directory_iterator it(run, ec), end; !ec && it != end; it.increment(ec)) {
    if (it.depth() > 2) it.disable_recursion_pending();
    const fs::path& p = it->path();
    if (it->is_directory(ec)) {
      if (fs::exists(p / "latest_checkpointed_iteration.txt", ec)) {
        s.checkpoint_dirs.push_back(p);
        it.disable_recursion_pending();
      }
      continue;
    }
    const std::string name = p.filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0) {
      if (std::find(s.tensorboard_dirs.begin(), s.tensorboard_dirs.end(), p.parent_path()) ==
          s.tensorboard_dirs.end())
        s.tensorboard_dirs.push_back(p.parent_path());
    } else if (p.extension() == ".jsonl") {
      s.metrics.push_back(p);
    } else if (is_log_name(p)) {
      // A log holds Megatron's interval lines (or the arguments block) in its first megabytes.
      std::ifstream in(p);
      std::string head(1 << 20, '\0');
      in.read(head.data(), std::streamsize(head.size()));
      head.resize(size_t(in.gcount()));
      if (head.find("consumed samples:") != std::string::npos ||
          head.find("------------------------ arguments") != std::string::npos)
        s.logs.push_back(p);
    }
  }
  MG_REQUIRE(!s.logs.empty() || !s.metrics.empty() || !s.tensorboard_dirs.empty(),
             "report: ", run.string(),
             " holds no training log (*.log, *.txt, *.out with Megatron's iteration "
             "lines), metrics (*.jsonl) or TensorBoard events; give the run's folder or log file");
  std::sort(s.logs.begin(), s.logs.end());
  std::sort(s.metrics.begin(), s.metrics.end());
  return s;
}

RunRecord read_run(const RunSources& src) {
  RunRecord r;
  for (const fs::path& p : src.logs) {
    parse_log(read_text(p), r);
    r.sources.push_back(p.string());
  }
  // JSONL metrics: complete lines only; each adds to (or is) the interval of its iteration.
  for (const fs::path& p : src.metrics) {
    std::istringstream in(read_text(p));
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("iteration")) continue;
      const int64_t it = j["iteration"].get<int64_t>();
      auto found = std::find_if(r.intervals.begin(), r.intervals.end(),
                                [&](const Interval& i) { return i.iteration == it; });
      if (found == r.intervals.end()) {
        Interval iv;
        iv.iteration = it;
        iv.consumed_samples = j.value("consumed_samples", int64_t(0));
        iv.lm_loss = j.value("lm_loss", std::nan(""));
        iv.learning_rate = j.value("learning_rate", 0.0);
        iv.loss_scale = j.value("loss_scale", 1.0);
        if (j.contains("grad_norm") && j["grad_norm"].is_number())
          iv.grad_norm = j["grad_norm"].get<double>();
        iv.ms_per_iteration = j.value("ms_per_iteration", 0.0);
        if (j.contains("tokens_per_second"))
          iv.tokens_per_second = j["tokens_per_second"].get<double>();
        iv.skipped = j.value("skipped_iterations", int64_t(0));
        r.intervals.push_back(iv);
        found = r.intervals.end() - 1;
      }
      if (j.contains("comm_ms_per_iteration"))
        found->comm_ms_per_iteration = j["comm_ms_per_iteration"].get<double>();
      if (r.layout.empty() && j.value("world_size", 1) > 1)
        r.layout = "world " + std::to_string(j.value("world_size", 1));
    }
    r.sources.push_back(p.string());
  }
  std::stable_sort(r.intervals.begin(), r.intervals.end(),
                   [](const Interval& a, const Interval& b) { return a.iteration < b.iteration; });
  // The folders the arguments name (relative to the current folder, as the run was likely
  // started from it), when they are there and not read already.
  std::vector<fs::path> tb = src.tensorboard_dirs, ck = src.checkpoint_dirs;
  auto add_named = [&](const char* arg, std::vector<fs::path>& dirs) {
    std::error_code ec;
    const auto d = r.argument(arg);
    if (!d || d->empty() || !fs::is_directory(*d, ec)) return;
    for (const fs::path& have : dirs)
      if (fs::equivalent(have, *d, ec)) return;
    dirs.push_back(*d);
  };
  add_named("tensorboard_dir", tb);
  add_named("save", ck);
  for (const fs::path& d : tb) {
    std::vector<fs::path> files;
    for (auto& [tag, v] : read_event_dir(d, &files)) {
      auto& dst = r.scalars[tag];
      dst.insert(dst.end(), v.begin(), v.end());
    }
    for (const fs::path& f : files) r.sources.push_back(f.string());
  }
  for (auto& [tag, v] : r.scalars)
    std::stable_sort(v.begin(), v.end(),
                     [](const Scalar& a, const Scalar& b) { return a.step < b.step; });
  for (const fs::path& d : ck) {
    read_checkpoints(d, r);
    r.sources.push_back(d.string());
  }
  return r;
}

}  // namespace megatron::report
