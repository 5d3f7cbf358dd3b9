// `megatron merge-datasets`: Megatron's tools/merge_datasets.py. Every PREFIX.bin/PREFIX.idx pair
// in --input is appended (add_index) in sorted stem order into --output-prefix; every stem needs
// both files and all datasets must share one dtype (the first one's). The output may not be
// written into the input folder.
#include <algorithm>
#include <filesystem>
#include <map>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "data/indexed_dataset.h"

namespace megatron::cli {
namespace {

namespace fs = std::filesystem;

void run(const std::string& input, const std::string& output_prefix, bool multimodal) {
  MG_REQUIRE(!multimodal, "--multimodal datasets (with sequence modes) are not supported");
  std::error_code ec;
  MG_REQUIRE(fs::is_directory(input, ec), "--input ", input, " is not a directory");
  fs::path parent = fs::path(output_prefix).parent_path();
  if (parent.empty()) parent = ".";
  MG_REQUIRE(fs::is_directory(parent, ec), "the folder of --output-prefix (", parent.string(),
             ") does not exist; create it first");
  // The output beside its inputs would be read back as an input: now (a previous output folded
  // in, every document twice) or on the next run, and could overwrite an input of the same name.
  MG_REQUIRE(fs::weakly_canonical(parent) != fs::weakly_canonical(input), "--output-prefix ",
             output_prefix, " is inside the --input folder ", input,
             ": the merged dataset would be merged into itself on the next run (its documents "
             "twice) and could overwrite an input; write it to another folder");

  std::map<std::string, std::pair<bool, bool>> stems;  // stem -> (has .bin, has .idx)
  for (const auto& entry : fs::directory_iterator(input)) {
    if (!entry.is_regular_file()) continue;
    const std::string ext = entry.path().extension().string();
    if (ext != ".bin" && ext != ".idx") continue;
    auto& s = stems[entry.path().stem().string()];
    (ext == ".bin" ? s.first : s.second) = true;
  }
  MG_REQUIRE(!stems.empty(), "no .bin/.idx datasets found in --input ", input);
  for (const auto& [stem, has] : stems) {
    MG_REQUIRE(has.first, "dataset ", (fs::path(input) / stem).string(), " has a .idx but no .bin");
    MG_REQUIRE(has.second, "dataset ", (fs::path(input) / stem).string(), " has a .bin but no .idx");
  }
  std::vector<std::string> prefixes;
  for (const auto& [stem, has] : stems) prefixes.push_back((fs::path(input) / stem).string());

  const data::IndexDType dtype = data::IndexedDataset(prefixes.front()).dtype();
  data::IndexedDatasetBuilder builder(output_prefix, dtype);
  for (const auto& p : prefixes) {
    log_info("merging ", p);
    builder.add_index(p);
  }
  builder.finalize();
  log_print(str("merged ", prefixes.size(), " datasets: ", builder.num_documents(),
                " documents, ", builder.num_sequences(), " sequences, ", builder.num_tokens(),
                " tokens (", data::index_dtype_name(dtype), ") into ", output_prefix, ".bin/.idx"));
}

CommandRegistrar reg("merge-datasets", "Merge the .bin/.idx datasets of a folder into one", 101,
                     [](CLI::App& sub) {
                       auto input = std::make_shared<std::string>();
                       auto output = std::make_shared<std::string>();
                       auto multimodal = std::make_shared<bool>(false);
                       sub.add_option("--input", *input,
                                      "Folder holding the PREFIX.bin/PREFIX.idx pairs to merge")
                           ->required();
                       sub.add_option("--output-prefix", *output,
                                      "Output prefix (writes PREFIX.bin and PREFIX.idx)")
                           ->required();
                       sub.add_flag("--multimodal", *multimodal, "Multimodal datasets (unsupported)");
                       sub.callback([=] { run(*input, *output, *multimodal); });
                     });

}  // namespace
}  // namespace megatron::cli
