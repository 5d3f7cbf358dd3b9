// The pieces every torch_dist writer shares; see torch_dist_items.h.
#include "training/torch_dist_items.h"

#include <atomic>
#include <fstream>
#include <map>
#include <unistd.h>

#include "core/error.h"
#include "core/torch_file.h"
#include "model/model_settings.h"
#include "training/checkpoint.h"
#include "training/checkpoint_files.h"
#include "training/torch_checkpoint.h"

namespace megatron::training::torch_dist_io {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Document;
using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";

// torch.save of `root` in memory (written through a scratch file of the temporary folder).
std::vector<uint8_t> torch_save_bytes(const Value& root, const fs::path& scratch) {
  write_torch_file(scratch, root, "archive");
  std::ifstream in(scratch, std::ios::binary);
  std::vector<uint8_t> out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MG_REQUIRE(in.good() || in.eof(), scratch.string(), ": cannot be read back");
  fs::remove(scratch);
  return out;
}

Value* size_value(Document& doc, const Shape& s) {
  std::vector<Value*> items;
  for (int64_t d : s) items.push_back(doc.integer(d));
  Value* v = doc.tuple(items);
  v->text = "torch.Size";
  return v;
}

Value* object(Document& doc, const std::string& cls) {
  Value* v = doc.namespace_();
  v->text = cls;
  return v;
}

// TensorProperties(dtype) by its tuple state: (dtype, layout, requires_grad, memory format,
// pin_memory).
Value* tensor_properties(Document& doc, DType dtype) {
  Value* p = object(doc, std::string(kMeta) + "TensorProperties");
  Value* layout = doc.make(Kind::Enum);
  layout->text = "torch";
  layout->member = "strided";
  Value* format = doc.make(Kind::Enum);
  format->text = std::string(kMeta) + "_MEM_FORMAT_ENCODING";
  format->member = "TORCH_CONTIGUOUS_FORMAT";  // by name, as Python 3.11 pickles enum members
  p->items = {doc.torch_dtype(dtype), layout, doc.boolean(false), format, doc.boolean(false)};
  return p;
}

// A scratch file name no other process (every rank writes into the same folder) or thread uses.
std::string unique_scratch(const fs::path& tmp, const std::string& what) {
  static std::atomic<uint64_t> n{0};
  return (tmp / (".scratch_" + what + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++))).string();
}

}  // namespace

json records_to_json(const std::vector<ItemRecord>& rs) {
  json out = json::array();
  for (const ItemRecord& r : rs)
    out.push_back({r.key, r.is_bytes, dtype_name(r.dtype), r.global, r.offsets, r.sizes, r.file, r.offset, r.length});
  return out;
}

std::vector<ItemRecord> records_from_json(const json& j) {
  std::vector<ItemRecord> out;
  for (const json& e : j) {
    ItemRecord r;
    r.key = e[0];
    r.is_bytes = e[1];
    r.dtype = dtype_from_name(e[2].get<std::string>());
    r.global = e[3].get<Shape>();
    r.offsets = e[4].get<Shape>();
    r.sizes = e[5].get<Shape>();
    r.file = e[6];
    r.offset = e[7];
    r.length = e[8];
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::pair<int64_t, Tensor>> tp_chunks(const Tensor& full, const ShardRule& r, int t, int T,
                                                  const std::string& name) {
  if (r.dim < 0) return t == 0 ? std::vector<std::pair<int64_t, Tensor>>{{0, full}}
                               : std::vector<std::pair<int64_t, Tensor>>{};
  const int64_t size = full.size(r.dim);
  MG_REQUIRE(size % (int64_t(r.parts) * T) == 0, "tensor '", name, "' has ", size, " rows along dimension ",
             r.dim, ", which do not split into ", r.parts, " x ", T, " tensor-parallel chunks");
  const int64_t part = size / r.parts, n = part / T;
  std::vector<std::pair<int64_t, Tensor>> out;
  for (int j = 0; j < r.parts; ++j) {
    const int64_t at = j * part + t * n;
    out.emplace_back(at, full.narrow(r.dim, at, n).contiguous());
  }
  return out;
}

std::vector<std::pair<int64_t, Tensor>> local_chunks(const Tensor& local, const ShardRule& r, int t, int T) {
  if (r.dim < 0) return t == 0 ? std::vector<std::pair<int64_t, Tensor>>{{0, local.contiguous()}}
                               : std::vector<std::pair<int64_t, Tensor>>{};
  const int64_t n = local.size(r.dim) / r.parts;
  std::vector<std::pair<int64_t, Tensor>> out;
  for (int j = 0; j < r.parts; ++j)
    out.emplace_back(j * n * T + t * n, local.narrow(r.dim, j * n, n).contiguous());
  return out;
}

void add_chunks(std::vector<WriteItem>& items, const std::string& key, int layer, int L, const Shape& global,
                int dim, std::vector<std::pair<int64_t, Tensor>> chunks) {
  for (auto& [at, data] : chunks) {
    WriteItem it;
    it.key = key;
    it.global = global;
    it.offsets = Shape(global.size(), 0);
    if (dim >= 0) it.offsets[size_t(dim)] = at;
    it.data = data;
    if (layer >= 0) {
      it.global.insert(it.global.begin(), L);
      it.offsets.insert(it.offsets.begin(), layer);
      Shape s = data.shape();
      s.insert(s.begin(), 1);
      it.data = data.view(s);
    }
    items.push_back(std::move(it));
  }
}

WriteItem object_item(const std::string& key, const std::function<Value*(Document&)>& make, const fs::path& tmp) {
  Document d;
  d.root = make(d);
  WriteItem it;
  it.key = key;
  it.is_bytes = true;
  it.bytes = torch_save_bytes(*d.root, unique_scratch(tmp, "object"));
  return it;
}

std::vector<ItemRecord> write_rank_files(const fs::path& tmp, int rank, std::vector<WriteItem>& items) {
  std::vector<ItemRecord> records;
  for (int f = 0; f < 2; ++f) {
    const std::string file_name = str("__", rank, "_", f, ".distcp");
    const fs::path file = tmp / file_name;
    std::ofstream out(file, std::ios::binary);
    uint64_t offset = 0;
    for (size_t i = size_t(f); i < items.size(); i += 2) {
      WriteItem& it = items[i];
      ItemRecord r;
      r.key = it.key;
      r.is_bytes = it.is_bytes;
      if (!it.is_bytes) {
        Document d;
        d.root = d.tensor(it.data);
        it.bytes = torch_save_bytes(*d.root, unique_scratch(tmp, "item"));
        r.dtype = it.data.dtype();
        r.global = it.global;
        r.offsets = it.offsets;
        r.sizes = it.data.shape();
      }
      out.write(reinterpret_cast<const char*>(it.bytes.data()), std::streamsize(it.bytes.size()));
      r.file = file_name;
      r.offset = offset;
      r.length = it.bytes.size();
      offset += it.bytes.size();
      records.push_back(std::move(r));
      it.bytes = {};
      it.data = Tensor();
    }
    out.close();
    MG_REQUIRE(out.good(), file.string(), ": write failed (disk full?)");
    detail::set_mode(file, 0640);
  }
  return records;
}

void write_dcp_metadata(const fs::path& tmp, const std::vector<ItemRecord>& records, const std::string& checkpoint_id) {
  Document md;
  Value* sdm = md.dict();
  Value* storage = md.dict();
  std::map<std::string, Value*> described;  // key -> its TensorStorageMetadata
  for (const ItemRecord& r : records) {
    // MetadataIndex.__init__ sets fqn and index, and offset only when there is one.
    Value* index = object(md, std::string(kMeta) + "MetadataIndex");
    md.set(index, "fqn", md.str(r.key));
    if (r.is_bytes) {
      md.set(index, "index", md.none());
      pickle::Document::set(sdm, md.str(r.key), object(md, std::string(kMeta) + "BytesStorageMetadata"));
    } else {
      Value*& tsm = described[r.key];
      if (tsm == nullptr) {
        tsm = object(md, std::string(kMeta) + "TensorStorageMetadata");
        md.set(tsm, "properties", tensor_properties(md, r.dtype));
        md.set(tsm, "size", size_value(md, r.global));
        md.set(tsm, "chunks", md.list());
        pickle::Document::set(sdm, md.str(r.key), tsm);
      }
      Value* chunks = const_cast<Value*>(tsm->get("chunks"));
      Value* chunk = object(md, std::string(kMeta) + "ChunkStorageMetadata");
      md.set(chunk, "offsets", size_value(md, r.offsets));
      md.set(chunk, "sizes", size_value(md, r.sizes));
      md.set(index, "index", md.integer(int64_t(chunks->items.size())));
      md.set(index, "offset", size_value(md, r.offsets));
      chunks->items.push_back(chunk);
    }
    Value* info = object(md, "torch.distributed.checkpoint.filesystem._StorageInfo");
    md.set(info, "relative_path", md.str(r.file));
    md.set(info, "offset", md.integer(int64_t(r.offset)));
    md.set(info, "length", md.integer(int64_t(r.length)));
    pickle::Document::set(storage, index, info);
  }
  Value* root = object(md, std::string(kMeta) + "Metadata");
  md.root = root;
  md.set(root, "state_dict_metadata", sdm);
  md.set(root, "planner_data", md.dict());
  md.set(root, "storage_data", storage);
  Value* sm = object(md, std::string(kMeta) + "StorageMeta");
  md.set(sm, "checkpoint_id", md.str(checkpoint_id));
  md.set(sm, "save_id", md.str("0"));
  md.set(sm, "load_id", md.none());
  md.set(sm, "modules", md.list());
  md.set(root, "storage_meta", sm);
  md.set(root, "version", md.str("1.0.0"));
  std::vector<std::pair<std::string, Tensor>> none;
  // filesystem.py FileSystemWriter.finish: pickle.dump(metadata, file), the default protocol (4).
  const std::vector<uint8_t> bytes = pickle::pickle(*root, none, 4);
  std::ofstream out(tmp / ".metadata", std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  out.close();
  MG_REQUIRE(out.good(), (tmp / ".metadata").string(), ": write failed (disk full?)");
  detail::set_mode(tmp / ".metadata", 0640);
}

Value* param_groups_state(Document& doc, const TrainingArgs& a, bool adam, int64_t step, bool expert_parallel) {
  Value* groups = doc.list();
  for (int g = 0; g < 2; ++g) {
    Value* pg = doc.dict();
    doc.set(pg, "wd_mult", doc.real(g == 0 ? 1.0 : 0.0));
    doc.set(pg, "lr_mult", doc.real(1.0));
    doc.set(pg, "is_expert_parallel", doc.boolean(expert_parallel));
    doc.set(pg, "is_decoupled_lr", doc.boolean(false));
    doc.set(pg, "weight_decay", doc.real(g == 0 ? a.weight_decay : 0.0));
    if (adam) {
      doc.set(pg, "betas", doc.tuple({doc.real(a.optimizer.adam_beta1), doc.real(a.optimizer.adam_beta2)}));
      doc.set(pg, "eps", doc.real(a.optimizer.adam_eps));
      doc.set(pg, "bias_correction", doc.boolean(true));
      doc.set(pg, "amsgrad", doc.boolean(false));
    } else {
      doc.set(pg, "momentum", doc.real(a.optimizer.sgd_momentum));
    }
    doc.set(pg, "step", doc.integer(step));
    groups->items.push_back(pg);
  }
  Value* inner = doc.dict();
  doc.set(inner, "param_groups", groups);
  return inner;
}

void write_common_files(const fs::path& tmp, const CommonState& c) {
  const json& meta = c.meta;
  const json& args_json = meta.at("args");
  const TrainingArgs a = training_args_from_json(args_json);
  const int64_t iteration = meta.at("iteration").get<int64_t>();
  const std::string& form = c.optimizer_form;
  const bool distributed = form == "fully_reshardable" || form == "dp_reshardable";
  Document doc;
  Value* common = doc.dict();
  doc.root = common;
  json extra = {
      {"padded_vocab_size", c.padded_vocab_size}, {"tensor_model_parallel_size", c.tp},
      {"pipeline_model_parallel_size", c.pp}, {"virtual_pipeline_model_parallel_size", nullptr},
      {"data_parallel_size", c.dp}, {"world_size", c.tp * c.pp * c.dp},
      {"consumed_train_samples", meta.at("consumed_train_samples")},
      {"consumed_valid_samples", meta.at("consumed_valid_samples")}, {"iteration", iteration},
      {"fp16", a.fp16}, {"bf16", a.bf16}, {"params_dtype", dtype_name(c.dtype)},
      {"use_distributed_optimizer", distributed}, {"dist_ckpt_optim_fully_reshardable", form == "fully_reshardable"},
      {"overlap_grad_reduce", false}, {"ddp_bucket_size", nullptr},
      {"ckpt_format", "torch_dist"}, {"transformer_impl", c.transformer_impl},
      {"use_legacy_models", false}, {"use_mcore_models", true},
      {"encoder_num_layers", a.model.num_layers}, {"encoder_seq_length", a.model.seq_length}};
  extra.update(model::megatron_model_args(a.model));
  // The layout's own sizes (the recorded args may be another layout's, as a conversion's source).
  const bool chunks = c.vp > 1 && c.pp > 0 && a.model.num_layers % (int64_t(c.pp) * c.vp) == 0;
  extra["virtual_pipeline_model_parallel_size"] = chunks ? json(c.vp) : json(nullptr);
  extra["num_layers_per_virtual_pipeline_stage"] = chunks ? json(a.model.num_layers / (c.pp * c.vp)) : json(nullptr);
  extra["expert_model_parallel_size"] = c.ep;
  extra["expert_tensor_parallel_size"] = c.etp > 0 ? c.etp : c.tp;
  doc.set(common, "args", torch_args::to_namespace(doc, args_json, extra));
  doc.set(common, "checkpoint_version", doc.real(3.0));
  doc.set(common, "iteration", doc.integer(iteration));
  Value* sched = doc.dict();  // OptimizerParamScheduler.state_dict()
  for (const auto& [k, v] : meta.at("opt_param_scheduler").items()) {
    if (v.is_string()) doc.set(sched, k, doc.str(v.get<std::string>()));
    else if (v.is_number_integer()) doc.set(sched, k, doc.integer(v.get<int64_t>()));
    else if (v.is_number()) doc.set(sched, k, doc.real(v.get<double>()));
  }
  doc.set(common, "opt_param_scheduler", sched);
  if (!form.empty()) {
    Value* o = doc.dict();
    if (form != "dp_reshardable")  // dp_reshardable keeps it in a ShardedObject
      doc.set(o, "optimizer", param_groups_state(doc, a, c.optimizer_type == "adam", c.optimizer_step));
    if (distributed) {
      if (form == "fully_reshardable") doc.set(o, "param_state", doc.dict());
      doc.set(o, "param_state_sharding_type", doc.str(form));
    }
    if (c.chained) {  // ChainedOptimizer: one entry per optimizer, both alike here
      Value* chain = doc.dict();
      Document::set(chain, doc.integer(0), o);
      Value* experts = doc.dict();
      doc.set(experts, "param_state_sharding_type", doc.str(form));
      Document::set(chain, doc.integer(1), experts);
      o = chain;
    }
    doc.set(common, "optimizer", o);
  }
  doc.set(common, "num_floating_point_operations_so_far", doc.real(0.0));
  write_torch_file(tmp / "common.pt", *common, "archive");
  detail::set_mode(tmp / "common.pt", 0640);
  detail::write_text_file(tmp / "metadata.json",
                          json{{"sharded_backend", "torch_dist"}, {"sharded_backend_version", 1},
                               {"common_backend", "torch"}, {"common_backend_version", 1}}
                              .dump());
}

}  // namespace megatron::training::torch_dist_io
