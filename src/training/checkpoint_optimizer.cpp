// Optimizer state in checkpoints (layout in checkpoint.h): the plain optimizer's per-parameter
// file, written by data-parallel rank 0, and the distributed optimizer's shards, one per
// data-parallel rank, each with a table of the parameter pieces it holds. Loading reads either
// kind in parameter space (StateReader), so a checkpoint resumes under any data-parallel size and
// with or without --use-distributed-optimizer.
#include <cstdio>
#include <map>
#include <set>

#include "core/error.h"
#include "training/checkpoint.h"
#include "training/checkpoint_files.h"
#include "training/torch_checkpoint.h"
#include "training/torch_dist_optimizer.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

Tensor step_tensor(int64_t steps) {
  Tensor step = Tensor::empty({}, DType::I64);
  *step.data<int64_t>() = steps;
  return step;
}

const char* type_name(const optim::OptimizerConfig& c) {
  return c.type == optim::OptimizerType::Adam ? "adam" : "sgd";
}

}  // namespace

namespace detail {

std::string plain_optimizer_file(const CheckpointRank& rank) {
  return rank.rank_dir() + "/optimizer.safetensors";
}

std::string distributed_optimizer_file(const std::string& rank_dir, int dp_rank) {
  char name[48];
  std::snprintf(name, sizeof name, "/distrib_optim_dp_%03d.safetensors", dp_rank);
  return rank_dir + name;
}

json save_optimizer_files(const fs::path& dir, optim::MegatronOptimizer& optimizer,
                          const CheckpointRank& rank, json& files) {
  const bool adam = optimizer.config().type == optim::OptimizerType::Adam;
  const model::ParameterList& ps = optimizer.parameters();
  const std::vector<optim::StatePiece> pieces = optimizer.state_pieces();
  const std::optional<optim::ShardBuffers> shard = optimizer.shard();
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("optimizer.step", step_tensor(optimizer.step_count()));
  if (!shard) {  // every data-parallel rank holds the same state: rank 0 saves it per parameter
    if (rank.edp_rank == 0) {  // (under expert parallelism, rank 0 of each EP rank's replicas)
      for (const optim::StatePiece& p : pieces) {
        const std::string& name = ps[p.param]->name;
        if (p.main.defined()) t.emplace_back("optimizer.state.fp32_param." + name, p.main);
        if (adam) {
          t.emplace_back("optimizer.state.exp_avg." + name, p.exp_avg);
          t.emplace_back("optimizer.state.exp_avg_sq." + name, p.exp_avg_sq);
        } else {
          t.emplace_back("optimizer.state.momentum_buffer." + name, p.exp_avg);
        }
      }
      write_tensor_file(dir, plain_optimizer_file(rank), t, files);
    }
    return {{"type", type_name(optimizer.config())}, {"distributed", false}};
  }
  // Each data-parallel rank saves its shard with the table of the pieces it holds. An fp32
  // model's parameters are its main weights (the all-gathered copy is bitwise equal).
  if (shard->main.defined()) t.emplace_back("optimizer.shard.fp32_param", shard->main);
  if (adam) {
    t.emplace_back("optimizer.shard.exp_avg", shard->exp_avg);
    t.emplace_back("optimizer.shard.exp_avg_sq", shard->exp_avg_sq);
  } else {
    t.emplace_back("optimizer.shard.momentum_buffer", shard->exp_avg);
  }
  json table = json::array();
  for (const optim::StatePiece& p : pieces)
    table.push_back({ps[p.param]->name, p.param_offset, p.length, p.shard_offset});
  write_tensor_file(dir, distributed_optimizer_file(rank.rank_dir(), rank.dp_rank), t, files,
                    {{"pieces", table.dump()}});
  return {{"type", type_name(optimizer.config())},
          {"distributed", true},
          {"data_parallel_size", rank.dp_size}};
}

}  // namespace detail

bool has_optimizer_state(const CheckpointOnDisk& ckpt) { return !ckpt.state.optimizer_type.empty(); }

namespace {

// The optimizer state of one model-parallel rank, readable in parameter space whichever layout
// it was saved in.
class StateReader {
 public:
  StateReader(const CheckpointOnDisk& ckpt, const CheckpointRank& rank, std::string hint,
              optim::MegatronOptimizer& optimizer)
      : hint_(std::move(hint)) {
    std::vector<std::string> rels;
    if (ckpt.format == "torch_dist") {  // Megatron-LM's model-space state, cut for this rank
      files_.push_back(read_torch_dist_optimizer(ckpt, optimizer, rank));
      labels_.push_back((ckpt.dir / ".metadata").string());
    } else if (ckpt.format == "torch") {  // Megatron-LM's file, its optimizer state under our names
      bool resharded = false;  // another EP size: every EP folder's state, by name
      TorchRankContents r = read_torch_rank_for(ckpt, rank, true, &resharded);
      resharded_ = resharded;
      MG_REQUIRE(r.optimizer.has_value(), r.notes.empty() ? "no optimizer state" : r.notes.back(), hint_);
      files_.push_back(std::move(*r.optimizer));
      labels_.push_back((ckpt.dir / rank.rank_dir() / kTorchCheckpointFile).string());
    } else if (!ckpt.parallel.distributed_optimizer) {
      const fs::path own = ckpt.dir / detail::plain_optimizer_file(rank);
      MG_REQUIRE(ckpt.parallel.expert_model_parallel_size != rank.ep_size || fs::exists(own),
                 "checkpoint optimizer file ", own.string(), " is missing", hint_);
      // Its own folder's file, or under another expert-parallel size every EP folder's, by name.
      detail::RankTensors rt = detail::read_rank_tensors(ckpt, rank, "optimizer.safetensors");
      files_.push_back(std::move(rt.contents));
      labels_.push_back(rt.label);
      resharded_ = rt.resharded;
    } else {
      distributed_ = true;  // every data-parallel rank's shard (in every EP folder)
      rels = detail::distributed_optimizer_files(ckpt, rank);
    }
    for (const std::string& rel : rels) {
      const fs::path file = ckpt.dir / rel;
      MG_REQUIRE(fs::exists(file), "checkpoint optimizer file ", file.string(), " is missing", hint_);
      files_.push_back(detail::read_tensor_file(ckpt, rel));
      labels_.push_back(file.string());
    }
    for (size_t f = 0; f < files_.size(); ++f) {
      const Tensor& s = take(f, "optimizer.step");
      MG_REQUIRE(s.dtype() == DType::I64 && s.numel() == 1 && *s.data<int64_t>() >= 0, labels_[f],
                 ": optimizer.step must be a non-negative I64 scalar", hint_);
      MG_REQUIRE(f == 0 || *s.data<int64_t>() == step_, labels_[f], ": optimizer.step ",
                 *s.data<int64_t>(), " differs from ", labels_[0], "'s ", step_);
      step_ = *s.data<int64_t>();
      if (distributed_) index_pieces(f);
    }
  }

  int64_t step() const { return step_; }

  // Elements [offset, offset + dst.numel()) of the flattened state `kind` ("fp32_param",
  // "exp_avg", "exp_avg_sq", "momentum_buffer") of the parameter `name` of `numel` elements.
  void read(const std::string& kind, const std::string& name, int64_t numel, int64_t offset,
            Tensor dst) {
    const int64_t n = dst.numel();
    dst = dst.view({-1});
    if (!distributed_) {
      const Tensor& t = take(0, "optimizer.state." + kind + "." + name);
      MG_REQUIRE(t.dtype() == DType::F32 && t.numel() == numel, labels_[0], ": tensor 'optimizer.state.",
                 kind, ".", name, "' is ", dtype_name(t.dtype()), " ", shape_str(t.shape()),
                 ", expected F32 with ", numel, " elements", hint_);
      dst.copy_(t.view({-1}).narrow(0, offset, n));
      return;
    }
    auto it = pieces_.find(name);
    MG_REQUIRE(it != pieces_.end(), "the distributed optimizer shards in ", labels_[0],
               "... hold no piece of parameter '", name, "'", hint_);
    int64_t covered = 0;
    for (const Piece& p : it->second) {
      const int64_t s = std::max(offset, p.param_offset);
      const int64_t e = std::min(offset + n, p.param_offset + p.length);
      if (s >= e) continue;
      const Tensor& t = take(p.file, "optimizer.shard." + kind);
      MG_REQUIRE(t.dtype() == DType::F32 && t.dim() == 1 && p.shard_offset + p.length <= t.numel(),
                 labels_[p.file], ": 'optimizer.shard.", kind, "' is ", dtype_name(t.dtype()), " ",
                 shape_str(t.shape()), ", too small for its pieces", hint_);
      dst.narrow(0, s - offset, e - s).copy_(t.narrow(0, p.shard_offset + (s - p.param_offset), e - s));
      covered += e - s;
    }
    MG_REQUIRE(covered == n, "the distributed optimizer shards of ", labels_[0],
               "... cover ", covered, " of elements [", offset, ", ", offset + n, ") of '", name,
               "' (", kind, "): a shard file is missing or from another checkpoint", hint_);
  }

  // Every tensor of a per-parameter file must have been used (a different model otherwise).
  // Under another expert-parallel size the files also hold the state of other ranks' experts.
  void finish() const {
    if (distributed_) return;
    for (const auto& [name, t] : files_[0].tensors)
      MG_REQUIRE(used_.count({0, name}) || (resharded_ && detail::is_expert_tensor_name(name)),
                 labels_[0], " has an unexpected tensor '", name, "'", hint_);
  }

 private:
  struct Piece {
    size_t file;
    int64_t param_offset, length, shard_offset;
  };

  const Tensor& take(size_t f, const std::string& name) {
    auto it = files_[f].tensors.find(name);
    MG_REQUIRE(it != files_[f].tensors.end(), labels_[f], " has no tensor '", name, "'", hint_);
    used_.insert({f, name});
    return it->second;
  }

  void index_pieces(size_t f) {
    auto m = files_[f].metadata.find("pieces");
    MG_REQUIRE(m != files_[f].metadata.end(), labels_[f], ": no \"pieces\" table in its metadata",
               hint_);
    const json j = json::parse(m->second, nullptr, /*allow_exceptions=*/false);
    MG_REQUIRE(j.is_array(), labels_[f], ": the \"pieces\" table is not a JSON array", hint_);
    for (const json& e : j) {
      MG_REQUIRE(e.is_array() && e.size() == 4 && e[0].is_string() && e[1].is_number_integer() &&
                     e[2].is_number_integer() && e[3].is_number_integer() && e[1].get<int64_t>() >= 0 &&
                     e[2].get<int64_t>() > 0 && e[3].get<int64_t>() >= 0,
                 labels_[f], ": malformed piece ", e.dump().substr(0, 80),
                 " (expected [name, param offset, length, shard offset])", hint_);
      pieces_[e[0].get<std::string>()].push_back(
          Piece{f, e[1].get<int64_t>(), e[2].get<int64_t>(), e[3].get<int64_t>()});
    }
  }

  std::string hint_;
  bool distributed_ = false, resharded_ = false;
  std::vector<SafetensorsContents> files_;
  std::vector<std::string> labels_;
  std::set<std::pair<size_t, std::string>> used_;
  std::map<std::string, std::vector<Piece>> pieces_;
  int64_t step_ = 0;
};

}  // namespace

void load_optimizer_state(const CheckpointOnDisk& ckpt, optim::MegatronOptimizer& optimizer,
                          const CheckpointRank& rank) {
  const std::string hint = " (pass --no-load-optim to start the optimizer fresh)";
  MG_REQUIRE(has_optimizer_state(ckpt), "checkpoint ", ckpt.dir.string(),
             ckpt.notes.empty() ? std::string(" has no optimizer state (saved with --no-save-optim)")
                                : ": " + ckpt.notes.back(),
             hint);
  const bool adam = optimizer.config().type == optim::OptimizerType::Adam;
  const std::string want = adam ? "adam" : "sgd";
  MG_REQUIRE(ckpt.state.optimizer_type == want, "the checkpoint ", ckpt.dir.string(), " holds ",
             ckpt.state.optimizer_type, " state but this run uses --optimizer ", want, hint);
  check_checkpoint_layout(ckpt, rank);
  StateReader rd(ckpt, rank, hint, optimizer);
  const model::ParameterList& ps = optimizer.parameters();
  // Whichever layout the checkpoint has, each piece this rank holds reads its elements.
  for (const optim::StatePiece& p : optimizer.state_pieces()) {
    const std::string& n = ps[p.param]->name;
    const int64_t numel = ps[p.param]->value.numel();
    if (p.main.defined()) rd.read("fp32_param", n, numel, p.param_offset, p.main);
    rd.read(adam ? "exp_avg" : "momentum_buffer", n, numel, p.param_offset, p.exp_avg);
    if (adam) rd.read("exp_avg_sq", n, numel, p.param_offset, p.exp_avg_sq);
  }
  // A rank holding all the state read all of a per-parameter file: nothing may be left over.
  if (!optimizer.shard()) rd.finish();
  optimizer.set_step_count(rd.step());
}

}  // namespace megatron::training
