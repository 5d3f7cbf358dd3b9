// Safetensors writing and the atomic checkpoint folder; see checkpoint.h.
#include "training/checkpoint.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron::training {

namespace fs = std::filesystem;

namespace {

const char* st_dtype(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    default: MG_THROW("checkpoint: cannot store dtype ", dtype_name(d), " in safetensors");
  }
}

void set_mode(const fs::path& p, mode_t mode) {
  MG_REQUIRE(::chmod(p.c_str(), mode) == 0, "cannot set permissions of ", p.string());
}

void write_text_file(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MG_REQUIRE(out.good(), "cannot write ", tmp.string(), "; check that the folder is writable");
    out << text;
    out.flush();
    MG_REQUIRE(out.good(), "write failed: ", tmp.string(), " (disk full?)");
  }
  set_mode(tmp, 0640);
  fs::rename(tmp, p);
}

}  // namespace

void write_safetensors(const fs::path& file, const model::ParameterList& params) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const model::Parameter* p : params) {
    MG_CHECK(p->value.is_contiguous(), "parameter ", p->name, " is not contiguous");
    nlohmann::ordered_json e;
    e["dtype"] = st_dtype(p->value.dtype());
    e["shape"] = p->value.shape();
    e["data_offsets"] = {offset, offset + p->value.nbytes()};
    header[p->name] = e;
    offset += p->value.nbytes();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  MG_REQUIRE(out.good(), "cannot write ", file.string(), "; check that the folder is writable");
  const uint64_t n = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const model::Parameter* p : params)
    out.write(static_cast<const char*>(p->value.raw_data()), std::streamsize(p->value.nbytes()));
  out.flush();
  MG_REQUIRE(out.good(), "write failed: ", file.string(), " (disk full?)");
  out.close();
  set_mode(file, 0640);
}

fs::path save_checkpoint(const fs::path& save_dir, const model::ParameterList& params,
                         const CheckpointInfo& info) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", (long long)info.iteration);
  fs::create_directories(save_dir);
  const fs::path final_dir = save_dir / name;
  const fs::path tmp_dir = save_dir / (std::string(".tmp_") + name);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir / "mp_rank_00");
  set_mode(tmp_dir, 0750);
  set_mode(tmp_dir / "mp_rank_00", 0750);
  write_safetensors(tmp_dir / "mp_rank_00" / "model.safetensors", params);
  nlohmann::ordered_json meta;
  meta["format_version"] = 1;
  meta["iteration"] = info.iteration;
  meta["consumed_train_samples"] = info.consumed_train_samples;
  meta["args"] = nlohmann::json::parse(info.args_json);
  write_text_file(tmp_dir / "metadata.json", meta.dump(2) + "\n");
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
  write_text_file(save_dir / "latest_checkpointed_iteration.txt", std::to_string(info.iteration));
  return final_dir;
}

}  // namespace megatron::training
