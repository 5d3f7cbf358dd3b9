// Megatron-LM's torch_dist checkpoints written without Python; see torch_dist_write.h.
#include "training/torch_dist_write.h"

#include <fstream>

#include "core/error.h"
#include "core/pickle.h"
#include "core/torch_file.h"
#include "model/model_settings.h"
#include "training/checkpoint_files.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Document;
using pickle::Kind;
using pickle::Value;

namespace {

constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";
constexpr const char* kLayers = "decoder.layers.";
constexpr const char* kWordEmbedding = "embedding.word_embeddings.weight";

// One item of a rank's files: a tensor chunk (key, global shape, offsets, contiguous data) or an
// object (key, torch.save bytes).
struct Item {
  std::string key;
  Shape global, offsets;
  Tensor data;
  std::vector<uint8_t> bytes;
  bool is_bytes = false;
};

// torch.save of `root` in memory (written through a scratch file of the temporary folder).
std::vector<uint8_t> torch_save_bytes(const Value& root, const fs::path& scratch) {
  write_torch_file(scratch, root, "archive");
  std::ifstream in(scratch, std::ios::binary);
  std::vector<uint8_t> out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MG_REQUIRE(in.good() || in.eof(), scratch.string(), ": cannot be read back");
  fs::remove(scratch);
  return out;
}

// Megatron-Core's key of one of our tensors and its global layer (-1: not a layer tensor).
std::pair<std::string, int> megatron_key(const std::string& ours, bool te) {
  const std::string name = torch_names::to_megatron(ours, 0, te);
  if (!name.starts_with(kLayers)) return {name, -1};
  const size_t at = std::string(kLayers).size(), dot = name.find('.', at);
  return {kLayers + name.substr(dot + 1), std::stoi(name.substr(at, dot - at))};
}

// Tensor-parallel rank t's chunks of a global tensor: (offset along the rule's dimension, data);
// a replicated tensor is TP rank 0's. Each of the rule's parts (SwiGLU's gate and up) is its own
// chunk, as Megatron's apply_swiglu_sharded_factory saves them.
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

}  // namespace

fs::path write_torch_dist_checkpoint(const MergedCheckpoint& m, const fs::path& save_dir, int T, int P,
                                     const TorchSaveOptions& options) {
  MG_REQUIRE(options.transformer_impl == "transformer_engine" || options.transformer_impl == "local",
             "--transformer-impl must be transformer_engine or local (got '", options.transformer_impl, "')");
  const bool te = options.transformer_impl == "transformer_engine";
  const json& meta = m.metadata;
  const json& args_json = meta.at("args");
  const TrainingArgs a = training_args_from_json(args_json);
  MG_REQUIRE(a.model.family_id() == model::ModelFamilyId::gpt && a.model.num_moe_experts == 0,
             "--save-format torch_dist writes GPT models (dense) only: keep this build's format, or "
             "--save-format torch, for BERT, T5 and mixture-of-experts checkpoints");
  const int L = int(a.model.num_layers);
  MG_REQUIRE(L % P == 0, "--target-pipeline-parallel-size ", P, " does not divide the ", L, " layers");
  const int64_t iteration = meta.at("iteration").get<int64_t>();
  const std::string dir_name = m.source.release ? "release" : iteration_dir_name(iteration);
  const bool optim = !m.optimizer_type.empty();
  const bool adam = m.optimizer_type == "adam";
  const DType dtype = m.model.at(kWordEmbedding).dtype();

  const fs::path tmp = save_dir / (".tmp_" + dir_name);
  detail::create_private_dirs(save_dir);
  fs::remove_all(tmp);
  detail::create_private_dirs(tmp);

  // The states written per tensor: the weights, then the optimizer's in model space.
  std::vector<std::pair<std::string, std::function<Tensor(const std::string&)>>> states = {
      {"", [&](const std::string& n) { return m.model.at(n); }}};
  if (optim) {
    states.emplace_back("optimizer.state.param.", [&](const std::string& n) {
      auto fp32 = m.optimizer.find("fp32_param");
      return fp32 != m.optimizer.end() && fp32->second.count(n) ? fp32->second.at(n) : m.model.at(n).to(DType::F32);
    });
    for (const char* k : adam ? std::vector<const char*>{"exp_avg", "exp_avg_sq"}
                              : std::vector<const char*>{"momentum_buffer"})
      states.emplace_back(std::string("optimizer.state.") + k + ".",
                          [&m, k](const std::string& n) { return m.optimizer.at(k).at(n); });
  }

  Document md;  // .metadata
  Value* sdm = md.dict();
  Value* storage = md.dict();
  std::map<std::string, Value*> described;  // key -> its TensorStorageMetadata
  int objects = 0;
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) {
      const int rank = t + T * p;
      std::vector<Item> items;
      for (const auto& [prefix, get] : states)
        for (const auto& [name, full] : m.model) {
          const auto [key, layer] = megatron_key(name, te);
          const int stage = layer >= 0 ? layer / (L / P) : name.starts_with("embedding.") ? 0 : P - 1;
          if (stage != p) continue;
          const ShardRule& rule = m.rules.at(name);
          const Tensor value = get(name);
          for (auto& [at, data] : tp_chunks(value, rule, t, T, name)) {
            Item it;
            it.key = prefix + key;
            it.global = value.shape();
            it.offsets = Shape(value.dim(), 0);
            if (rule.dim >= 0) it.offsets[size_t(rule.dim)] = at;
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
      // ShardedObjects: each layer module's _extra_state (TP rank 0), the output layer's, the RNG.
      auto add_object = [&](const std::string& key, const std::function<Value*(Document&)>& make) {
        Document d;
        d.root = make(d);
        Item it;
        it.key = key;
        it.is_bytes = true;
        it.bytes = torch_save_bytes(*d.root, tmp / (".object_" + std::to_string(objects++)));
        items.push_back(std::move(it));
      };
      auto none_list = [](Document& d) { return d.list({d.none()}); };
      if (t == 0) {
        for (int layer = p * (L / P); layer < (p + 1) * (L / P); ++layer)
          for (const std::string& e : torch_names::extra_state_names(layer, te, "decoder"))
            add_object(megatron_key(e, te).first + "/shard_" + std::to_string(layer) + "_" + std::to_string(L),
                       none_list);
        if (p == P - 1) add_object("output_layer._extra_state/shard_0_1", none_list);
      }
      if (!meta.value("rng_state", json()).is_null()) {
        const json& rng = meta.at("rng_state");
        add_object(str("rng_state/shard_", p, ".", t, "_", P, ".", T), [&](Document& d) {
          return torch_rng::megatron_rng_state(d, a.seed, t, p, rng.at("seed").get<uint64_t>(),
                                               rng.at("dropout_offset").get<uint64_t>());
        });
      }

      // Two files (Megatron's two writer threads per rank), the items alternating between them.
      for (int f = 0; f < 2; ++f) {
        const std::string file_name = str("__", rank, "_", f, ".distcp");
        const fs::path file = tmp / file_name;
        std::ofstream out(file, std::ios::binary);
        uint64_t offset = 0;
        for (size_t i = size_t(f); i < items.size(); i += 2) {
          Item& it = items[i];
          if (!it.is_bytes) {
            Document d;
            d.root = d.tensor(it.data);
            it.bytes = torch_save_bytes(*d.root, tmp / (".item_" + std::to_string(rank)));
          }
          out.write(reinterpret_cast<const char*>(it.bytes.data()), std::streamsize(it.bytes.size()));
          // MetadataIndex.__init__ sets fqn and index, and offset only when there is one.
          Value* index = object(md, std::string(kMeta) + "MetadataIndex");
          md.set(index, "fqn", md.str(it.key));
          if (it.is_bytes) {
            md.set(index, "index", md.none());
            pickle::Document::set(sdm, md.str(it.key), object(md, std::string(kMeta) + "BytesStorageMetadata"));
          } else {
            Value*& tsm = described[it.key];
            if (tsm == nullptr) {
              tsm = object(md, std::string(kMeta) + "TensorStorageMetadata");
              md.set(tsm, "properties", tensor_properties(md, it.data.dtype()));
              md.set(tsm, "size", size_value(md, it.global));
              md.set(tsm, "chunks", md.list());
              pickle::Document::set(sdm, md.str(it.key), tsm);
            }
            Value* chunks = const_cast<Value*>(tsm->get("chunks"));
            Value* chunk = object(md, std::string(kMeta) + "ChunkStorageMetadata");
            md.set(chunk, "offsets", size_value(md, it.offsets));
            md.set(chunk, "sizes", size_value(md, it.data.shape()));
            md.set(index, "index", md.integer(int64_t(chunks->items.size())));
            md.set(index, "offset", size_value(md, it.offsets));
            chunks->items.push_back(chunk);
          }
          Value* info = object(md, "torch.distributed.checkpoint.filesystem._StorageInfo");
          md.set(info, "relative_path", md.str(file_name));
          md.set(info, "offset", md.integer(int64_t(offset)));
          md.set(info, "length", md.integer(int64_t(it.bytes.size())));
          pickle::Document::set(storage, index, info);
          offset += it.bytes.size();
          it.bytes.clear();
          it.bytes.shrink_to_fit();
        }
        out.close();
        MG_REQUIRE(out.good(), file.string(), ": write failed (disk full?)");
        detail::set_mode(file, 0640);
      }
    }

  Value* root = object(md, std::string(kMeta) + "Metadata");
  md.root = root;
  md.set(root, "state_dict_metadata", sdm);
  md.set(root, "planner_data", md.dict());
  md.set(root, "storage_data", storage);
  Value* sm = object(md, std::string(kMeta) + "StorageMeta");
  md.set(sm, "checkpoint_id", md.str((save_dir / dir_name).string()));
  md.set(sm, "save_id", md.str("0"));
  md.set(sm, "load_id", md.none());
  md.set(sm, "modules", md.list());
  md.set(root, "storage_meta", sm);
  md.set(root, "version", md.str("1.0.0"));
  {
    std::vector<std::pair<std::string, Tensor>> none;
    const std::vector<uint8_t> bytes = pickle::pickle(*root, none);
    std::ofstream out(tmp / ".metadata", std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    out.close();
    MG_REQUIRE(out.good(), (tmp / ".metadata").string(), ": write failed (disk full?)");
    detail::set_mode(tmp / ".metadata", 0640);
  }

  // common.pt: what is not sharded.
  Document doc;
  Value* common = doc.dict();
  doc.root = common;
  json extra = {
      {"padded_vocab_size", m.padded_vocab_size}, {"tensor_model_parallel_size", T},
      {"pipeline_model_parallel_size", P}, {"virtual_pipeline_model_parallel_size", nullptr},
      {"data_parallel_size", 1}, {"world_size", T * P},
      {"consumed_train_samples", meta.at("consumed_train_samples")},
      {"consumed_valid_samples", meta.at("consumed_valid_samples")}, {"iteration", iteration},
      {"fp16", a.fp16}, {"bf16", a.bf16}, {"params_dtype", dtype_name(dtype)},
      {"use_distributed_optimizer", optim}, {"dist_ckpt_optim_fully_reshardable", optim},
      {"ckpt_format", "torch_dist"}, {"transformer_impl", options.transformer_impl},
      {"use_legacy_models", false}, {"use_mcore_models", true},
      {"encoder_num_layers", L}, {"encoder_seq_length", a.model.seq_length}};
  extra.update(model::megatron_model_args(a.model));
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
  if (optim) {  // DistributedOptimizer.state_dict(): the inner optimizer's groups without params
    Value* groups = doc.list();
    for (int g = 0; g < 2; ++g) {
      Value* pg = doc.dict();
      doc.set(pg, "wd_mult", doc.real(g == 0 ? 1.0 : 0.0));
      doc.set(pg, "lr_mult", doc.real(1.0));
      doc.set(pg, "is_expert_parallel", doc.boolean(false));
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
      doc.set(pg, "step", doc.integer(m.optimizer_step));
      groups->items.push_back(pg);
    }
    Value* inner = doc.dict();
    doc.set(inner, "param_groups", groups);
    Value* o = doc.dict();
    doc.set(o, "optimizer", inner);
    doc.set(o, "param_state", doc.dict());
    doc.set(o, "param_state_sharding_type", doc.str("fully_reshardable"));
    doc.set(common, "optimizer", o);
  }
  doc.set(common, "num_floating_point_operations_so_far", doc.real(0.0));
  write_torch_file(tmp / "common.pt", *common, "archive");
  detail::set_mode(tmp / "common.pt", 0640);
  detail::write_text_file(tmp / "metadata.json",
                          json{{"sharded_backend", "torch_dist"}, {"sharded_backend_version", 1},
                               {"common_backend", "torch"}, {"common_backend_version", 1}}
                              .dump());
  detail::fsync_path(tmp, true);
  detail::publish_iteration(save_dir, tmp, dir_name, m.source.release ? std::string("release")
                                                                       : std::to_string(iteration));
  return save_dir / dir_name;
}

}  // namespace megatron::training
