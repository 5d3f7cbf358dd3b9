// `checkpoint convert` from and to Hugging Face folders (hf_checkpoint.h): the front ends that
// checkpoint_convert.cpp dispatches --save-format hf and --load-format hf to.
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "optim/lr_scheduler.h"
#include "training/checkpoint_files.h"
#include "training/hf_checkpoint.h"
#include "training/hf_checkpoint_internal.h"

namespace megatron::training::convert_detail {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::set_mode;

// --save-format hf: the merged tensors as a transformers folder.
ConvertResult export_hf(const CheckpointOnDisk& ckpt, const TrainingArgs& args, const ConvertOptions& o) {
  MG_REQUIRE(o.target_tp == 1 && o.target_pp == 1 && o.target_layers_per_virtual_stage == 0,
             "--target-tensor-parallel-size, --target-pipeline-parallel-size and "
             "--target-num-layers-per-virtual-pipeline-stage do not apply to --save-format hf: a "
             "transformers folder holds whole tensors");
  const std::string type = hf_model_type(args.model);  // before any tensor is read
  std::string why_not;
  const std::optional<int64_t> vocab = true_vocab_size(o, args, &why_not);
  MG_REQUIRE(vocab.has_value(), "--save-format hf cuts the padded vocabulary to the tokenizer's, "
             "but the tokenizer cannot be built (", why_not, "): pass its files (--vocab-file and "
             "--merge-file, or --tokenizer-model) or the size with --true-vocab-size N");
  MergedCheckpoint m = merge_checkpoint(ckpt, false);
  HfExportOptions e;
  e.save = o.save;
  e.params_dtype = o.target_params_dtype;
  e.max_shard_bytes = o.max_shard_bytes;
  e.true_vocab_size = *vocab;
  e.tokenizer = o.tokenizer ? *o.tokenizer : args.tokenizer;
  e.print_structure = o.print_structure;
  const HfExportResult r = export_hf_checkpoint(m, args, e);
  ConvertResult res;
  res.dir = o.save;
  res.iteration = ckpt.state.iteration;
  res.from = ckpt.parallel;
  res.padded_vocab_from = m.padded_vocab_size;
  res.padded_vocab_to = *vocab;
  res.optimizer_note = "a transformers folder holds weights only";
  res.num_tensors = r.tensors.size();
  res.num_files = r.files.size();
  res.notes = m.notes;
  res.notes.insert(res.notes.end(), r.notes.begin(), r.notes.end());
  res.hf_model_type = type;
  return res;
}

namespace {

// A fresh checkpoint's metadata (iteration 0, no optimizer, scheduler or RNG state) for `args`.
json fresh_metadata(const TrainingArgs& args) {
  CheckpointMetadata m;
  m.state.args = training_args_to_json(args);
  return json(checkpoint_metadata_to_json(m));
}

}  // namespace

// --load-format hf: a transformers folder as a release checkpoint (weights only) in the target
// layout, or (--save-format hf) written again as a transformers folder.
ConvertResult import_hf(const ConvertOptions& o) {
  HfImport im = read_hf_checkpoint(o.load, o.make_vocab_size_divisible_by, o.target_tp, o.tokenizer);
  TrainingArgs& args = im.args;
  if (o.target_params_dtype && *o.target_params_dtype != args.model.params_dtype) {
    const DType d = *o.target_params_dtype;
    for (auto& [name, t] : im.model) t = t.to(d);
    args.model.params_dtype = d;
    args.bf16 = d == DType::BF16;
    args.fp16 = d == DType::F16;
  }
  if (o.print_structure)
    for (const auto& [name, t] : im.model)
      log_print(str(name, " ", shape_str(t.shape()), " ", dtype_name(t.dtype())));
  MergedCheckpoint m;
  m.source.dir = o.load / "release";
  m.source.release = true;
  m.source.format = "hf";
  m.notes = im.notes;
  m.specs = config_weight_specs(args.model);
  for (const auto& [name, t] : im.model) {
    auto spec = m.specs.find(name);
    MG_REQUIRE(spec != m.specs.end(), o.load.string(), ": imported tensor '", name,
               "' is not a parameter of the model its config describes");
    m.rules[name] = shard_rule(spec->second);
  }
  m.model = std::move(im.model);
  m.padded_vocab_size = im.true_vocab_size;
  ConvertResult res;
  res.padded_vocab_from = im.true_vocab_size;
  res.hf_model_type = im.model_type;
  if (o.save_format == "hf") {
    MG_REQUIRE(o.target_tp == 1 && o.target_pp == 1 && o.target_layers_per_virtual_stage == 0,
               "--target-* sizes do not apply to --save-format hf");
    HfExportOptions e;
    e.save = o.save;
    e.max_shard_bytes = o.max_shard_bytes;
    e.true_vocab_size = im.true_vocab_size;
    e.print_structure = o.print_structure;
    if (!im.tokenizer_files.empty() || (o.tokenizer && !o.tokenizer->type.empty())) {
      e.tokenizer = args.tokenizer;  // paths relative to the folder read
      for (std::string* f : {&e.tokenizer->vocab_file, &e.tokenizer->merge_file, &e.tokenizer->tokenizer_model})
        if (!f->empty() && fs::path(*f).is_relative() && !im.tokenizer_files.empty()) *f = (o.load / *f).string();
    }
    const HfExportResult r = export_hf_checkpoint(m, args, e);
    res.dir = o.save;
    res.padded_vocab_to = im.true_vocab_size;
    res.num_tensors = r.tensors.size();
    res.num_files = r.files.size();
    res.notes = m.notes;
    res.notes.insert(res.notes.end(), r.notes.begin(), r.notes.end());
    res.optimizer_note = "a transformers folder holds weights only";
    return res;
  }
  const int L = args.model.num_layers;
  const model::PipelineLayout layout = target_layout(args, o, (o.load / "config.json").string());
  args.model.validate_tensor_parallel(o.target_tp);  // heads, groups, FFN, padded vocabulary
  // The tokenizer files go next to the checkpoint; its args name them there.
  const fs::path save_abs = fs::absolute(o.save);
  for (std::string* f : {&args.tokenizer.vocab_file, &args.tokenizer.merge_file, &args.tokenizer.tokenizer_model})
    if (!f->empty() && fs::path(*f).is_relative() && !im.tokenizer_files.empty()) *f = (save_abs / *f).string();
  repad_vocabulary(m, args.model.padded_vocab_size);
  m.metadata = fresh_metadata(args);
  res.padded_vocab_to = args.model.padded_vocab_size;
  res = write_target(m, o, layout, L, args.model.padded_vocab_size, std::move(res));
  for (const std::string& f : im.tokenizer_files) {
    const fs::path to = o.save / fs::path(f).filename();
    fs::copy_file(f, to, fs::copy_options::overwrite_existing);
    set_mode(to, 0640);
  }
  res.optimizer_note = "a transformers folder holds weights only";
  return res;
}


}  // namespace megatron::training::convert_detail
