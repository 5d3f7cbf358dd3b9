// `megatron report RUN`: one self-contained HTML page about a training run from its log, JSONL
// metrics, TensorBoard events and checkpoints (src/report/). Works on a running job: run it again
// to refresh (--refresh N makes the page reload itself).
#include <filesystem>
#include <optional>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "plan/device.h"
#include "report/html_report.h"
#include "report/unigram.h"

namespace megatron::cli {
namespace {

namespace fs = std::filesystem;

struct ReportFlags {
  std::string run, output, title, device;
  std::vector<std::string> logs, metrics, tensorboard_dirs, checkpoint_dirs, data_path;
  std::optional<double> peak_tflops, unigram_loss;
  bool no_unigram = false;
  int refresh = 0;
};

void run(const ReportFlags& f) {
  report::RunSources src = report::find_run_sources(f.run);
  for (const auto& p : f.logs) src.logs.push_back(p);
  for (const auto& p : f.metrics) src.metrics.push_back(p);
  for (const auto& p : f.tensorboard_dirs) src.tensorboard_dirs.push_back(p);
  for (const auto& p : f.checkpoint_dirs) src.checkpoint_dirs.push_back(p);
  const report::RunRecord rec = report::read_run(src);
  report::ReportOptions o;
  const fs::path run_path = fs::absolute(f.run).lexically_normal();
  o.title = !f.title.empty()              ? f.title
            : run_path.filename().empty() ? run_path.parent_path().filename().string()
                                          : run_path.filename().string();
  o.refresh_seconds = f.refresh;
  MG_REQUIRE(f.refresh >= 0, "--refresh must be >= 0 seconds (got ", f.refresh, ")");
  if (f.peak_tflops) {
    MG_REQUIRE(*f.peak_tflops > 0, "--peak-tflops must be > 0 (got ", *f.peak_tflops, ")");
    o.peak_tflops = *f.peak_tflops;
    o.peak_name = "as given by --peak-tflops";
  } else if (!f.device.empty()) {
    const bool half =
        rec.argument("bf16").value_or("") == "True" || rec.argument("fp16").value_or("") == "True";
    const plan::DeviceSpec d = plan::make_device(f.device, 1, {}, half);
    o.peak_tflops = d.peak_flops / 1e12;
    o.peak_name = f.device == "cpu" ? "this machine's CPU, measured"
                                    : f.device + (half ? " dense bf16" : " dense TF32");
  }
  if (f.unigram_loss) {
    o.unigram_loss = *f.unigram_loss;
    o.unigram_source = "as given by --unigram-loss";
  } else if (!f.no_unigram) {
    if (auto u = report::unigram_baseline(rec, f.data_path)) {
      o.unigram_loss = u->loss;
      o.unigram_source = "unigram entropy of " + u->source;
    }
  }
  const fs::path out = !f.output.empty()         ? fs::path(f.output)
                       : fs::is_directory(f.run) ? fs::path(f.run) / "report.html"
                                                 : fs::path(f.run).replace_extension(".html");
  report::write_report(report::build_report_model(rec, o), out);
  log_print(str("report: ", rec.intervals.size(), " logged intervals, ", rec.evaluations.size(),
                " evaluations, ", rec.scalars.size(), " TensorBoard tags, ", rec.checkpoints.size(),
                " checkpoints -> ", out.string()));
}

CommandRegistrar reg(
    "report",
    "Write a self-contained HTML training report from a run's log, "
    "metrics, TensorBoard events and checkpoints",
    22, [](CLI::App& sub) {
      auto f = std::make_shared<ReportFlags>();
      sub.add_option("run", f->run,
                     "The run's folder (searched for logs, *.jsonl, event files and "
                     "checkpoints) or its log file")
          ->required();
      sub.add_option("--output,-o", f->output,
                     "The HTML file (default RUN/report.html, or the log's name with .html)");
      sub.add_option("--title", f->title, "The report's title (default the run's name)");
      sub.add_option("--log", f->logs, "More log files to read");
      sub.add_option("--metrics", f->metrics, "More --log-metrics-jsonl files to read");
      sub.add_option("--tensorboard-dir", f->tensorboard_dirs, "More TensorBoard folders to read");
      sub.add_option("--checkpoints", f->checkpoint_dirs,
                     "More checkpoint folders (--save) to list");
      sub.add_option("--peak-tflops", f->peak_tflops, "Dense peak TFLOP/s per device, for MFU");
      sub.add_option("--device", f->device, "h100, h200 or cpu (measured here): the peak for MFU")
          ->check(CLI::IsMember({"h100", "h200", "cpu"}));
      sub.add_option("--unigram-loss", f->unigram_loss,
                     "The unigram baseline in nats (default: from the data)");
      sub.add_option("--data-path", f->data_path,
                     "[WEIGHT] PREFIX ... for the unigram baseline "
                     "(default: the run's own)");
      sub.add_flag("--no-unigram", f->no_unigram, "Do not compute the unigram baseline");
      sub.add_option("--refresh", f->refresh,
                     "Seconds after which the page reloads itself (0: never)")
          ->capture_default_str();
      sub.callback([f] { run(*f); });
    });

}  // namespace
}  // namespace megatron::cli
