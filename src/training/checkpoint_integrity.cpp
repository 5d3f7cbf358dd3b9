// Integrity of checkpoint folders: SHA-256 of files, metadata.json's own checksum file, verified
// reads of tensor files (size, SHA-256, then every floating-point value finite), folders created
// 0750 whatever the umask, and the leftovers of interrupted saves (.tmp_iter_*, .old_iter_*).
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "training/checkpoint_files.h"

namespace megatron::training {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* const kMetadata = "metadata.json";
const char* const kMetadataChecksum = "metadata.json.sha256";
// The key of metadata.json that says its checksum file was written beside it (every checkpoint
// of this build): then a missing checksum file is an error, not the warning older checkpoints get.
const char* const kChecksumKey = "metadata_checksum_file";

struct Sha256 {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  Sha256() { MG_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "SHA-256 init"); }
  void update(const void* p, size_t n) { MG_CHECK(EVP_DigestUpdate(ctx.get(), p, n) == 1, "SHA-256"); }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    MG_CHECK(EVP_DigestFinal_ex(ctx.get(), md, &len) == 1, "SHA-256 final");
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < len; ++i) {
      out.push_back(digits[md[i] >> 4]);
      out.push_back(digits[md[i] & 15]);
    }
    return out;
  }
};

std::string sha256_of(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex();
}

std::vector<uint8_t> read_bytes(const fs::path& file) {
  std::error_code ec;
  MG_REQUIRE(fs::is_regular_file(file, ec), "checkpoint file ", file.string(),
             fs::exists(file, ec) ? " is not a regular file" : " is missing");
  const uint64_t size = fs::file_size(file);
  std::vector<uint8_t> bytes(size);
  std::ifstream in(file, std::ios::binary);
  MG_REQUIRE(in && in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size)),
             "cannot read ", file.string());
  return bytes;
}

// Index and kind of the first value that is not finite, or -1.
template <typename Bits>
int64_t first_special(const Tensor& t, Bits exponent_mask, Bits mantissa_mask, bool* nan) {
  const Bits* p = static_cast<const Bits*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i)
    if ((p[i] & exponent_mask) == exponent_mask) {
      *nan = (p[i] & mantissa_mask) != 0;
      return i;
    }
  return -1;
}

}  // namespace

std::string sha256_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  MG_REQUIRE(in, "cannot read ", file.string());
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    h.update(buf.data(), size_t(in.gcount()));
  }
  MG_REQUIRE(in.eof(), "cannot read ", file.string());
  return h.hex();
}

void check_finite_tensor(const Tensor& t, const std::string& name, const std::string& where,
                         const std::string& remedy) {
  int64_t at = -1;
  bool nan = false;
  switch (t.dtype()) {
    case DType::F32: at = first_special<uint32_t>(t, 0x7F800000u, 0x007FFFFFu, &nan); break;
    case DType::F64:
      at = first_special<uint64_t>(t, 0x7FF0000000000000ull, 0x000FFFFFFFFFFFFFull, &nan);
      break;
    case DType::F16: at = first_special<uint16_t>(t, 0x7C00, 0x03FF, &nan); break;
    case DType::BF16: at = first_special<uint16_t>(t, 0x7F80, 0x007F, &nan); break;
    default: return;  // integer tensors are always finite
  }
  MG_REQUIRE(at < 0, where, ": tensor '", name, "' holds ", nan ? "NaN" : "an infinity",
             " (element ", at, " of ", t.numel(), "); ",
             remedy.empty() ? "the weights are corrupted or the run had diverged when it was saved: "
                              "load an earlier iteration (--ckpt-step N)"
                            : remedy);
}

void check_finite_tensors(const std::map<std::string, Tensor>& tensors, const std::string& where) {
  for (const auto& [name, t] : tensors) check_finite_tensor(t, name, where);
}

json read_checkpoint_metadata(const fs::path& dir) {
  const std::string label = (dir / kMetadata).string();
  const std::string text = detail::read_metadata_text(dir);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  MG_REQUIRE(!j.is_discarded() && j.is_object(), label, " is not valid JSON (corrupted file?)");
  return j;
}

namespace detail {

std::string read_metadata_text(const fs::path& dir) {
  const fs::path meta = dir / kMetadata, sum = dir / kMetadataChecksum;
  std::error_code ec;
  MG_REQUIRE(fs::is_regular_file(meta, ec), "incomplete checkpoint: ", meta.string(),
             fs::exists(meta, ec) ? " is not a regular file" : " is missing");
  const std::vector<uint8_t> bytes = read_bytes(meta);
  if (!fs::exists(sum, ec)) {
    const json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
    MG_REQUIRE(!(j.is_object() && j.contains(kChecksumKey)), "incomplete checkpoint: ", sum.string(),
               " is missing, but ", meta.string(), " records that it was saved beside it (\"",
               kChecksumKey, "\"), so the contents of metadata.json cannot be verified. Copy ",
               kMetadataChecksum, " from the original checkpoint; if metadata.json is known to be "
               "intact, recreate it with `sha256sum metadata.json > metadata.json.sha256` in ",
               dir.string());
    static std::mutex mutex;
    static std::set<std::string> warned;  // once per file and process
    std::lock_guard lock(mutex);
    if (warned.insert(meta.string()).second)
      log_warn(meta.string(), " has no ", kMetadataChecksum,
               " beside it (saved by an older build): its contents cannot be verified");
  } else {
    const std::vector<uint8_t> line = read_bytes(sum);
    const std::string recorded(line.begin(), line.begin() + long(std::min<size_t>(line.size(), 64)));
    const bool well_formed =
        recorded.size() == 64 &&
        recorded.find_first_not_of("0123456789abcdef") == std::string::npos;
    MG_REQUIRE(well_formed, sum.string(), " is malformed: expected the SHA-256 of ", kMetadata,
               " as 64 hexadecimal digits (sha256sum's format)");
    const std::string actual = sha256_of(bytes.data(), bytes.size());
    MG_REQUIRE(actual == recorded, meta.string(),
               ": SHA-256 checksum mismatch (the file is corrupted or was edited): ", kMetadataChecksum,
               " records ", recorded, ", the file hashes to ", actual,
               ". If the edit was deliberate, run `sha256sum metadata.json > metadata.json.sha256` "
               "in ", dir.string());
  }
  return std::string(bytes.begin(), bytes.end());
}

void write_metadata(const fs::path& dir, const std::string& text) {
  // Recorded in the file itself, so that deleting the checksum file does not pass for an older
  // checkpoint that never had one.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  MG_CHECK(j.is_object(), "write_metadata: the metadata is not a JSON object");
  j[kChecksumKey] = kMetadataChecksum;
  const std::string out = j.dump(2) + "\n";
  write_text_file(dir / kMetadata, out);
  write_text_file(dir / kMetadataChecksum, sha256_of(out.data(), out.size()) + "  " + kMetadata + "\n");
}

SafetensorsContents read_tensor_file(const CheckpointOnDisk& ckpt, const std::string& rel) {
  const fs::path file = ckpt.dir / rel;
  const std::string meta = (ckpt.dir / kMetadata).string();
  MG_REQUIRE(ckpt.files.is_object() && ckpt.files.contains(rel), meta, " lists no checksum for ", rel);
  const json& f = ckpt.files[rel];
  MG_REQUIRE(f.is_object() && f.contains("bytes") && f["bytes"].is_number_unsigned() &&
                 f.contains("sha256") && f["sha256"].is_string(),
             meta, ": malformed \"files\" entry for ", rel);
  std::error_code ec;
  MG_REQUIRE(fs::is_regular_file(file, ec), "checkpoint file ", file.string(), " is missing");
  const uint64_t expected = f["bytes"].get<uint64_t>();
  const uint64_t actual = fs::file_size(file);
  MG_REQUIRE(actual == expected, file.string(), " has ", actual, " bytes but metadata.json records ",
             expected, " (truncated or partially written file)");
  const std::vector<uint8_t> bytes = read_bytes(file);
  const std::string sha = sha256_of(bytes.data(), bytes.size());
  MG_REQUIRE(sha == f["sha256"].get<std::string>(), file.string(),
             ": SHA-256 checksum mismatch (file is corrupted): expected ",
             f["sha256"].get<std::string>(), ", got ", sha);
  SafetensorsContents st = parse_safetensors(bytes, file.string());
  check_finite_tensors(st.tensors, file.string());
  return st;
}

void create_private_dirs(const fs::path& p) {
  std::error_code ec;
  if (p.empty() || fs::is_directory(p, ec)) return;
  MG_REQUIRE(!fs::exists(p, ec), "cannot create the folder ", p.string(),
             ": a file of that name exists; choose another --save");
  if (p.has_parent_path() && p.parent_path() != p) create_private_dirs(p.parent_path());
  if (::mkdir(p.c_str(), 0750) != 0 && errno != EEXIST)
    MG_THROW("cannot create the folder ", p.string(), ": ", std::strerror(errno),
             "; check that --save is writable");
  set_mode(p, 0750);  // whatever the umask took away
}

std::vector<std::string> leftover_folders(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((name.starts_with(".tmp_iter_") || name.starts_with(".old_iter_") ||
         name.starts_with(".tmp_release") || name.starts_with(".old_release")) &&
        e.is_directory(ec))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void clean_leftovers(const fs::path& save_dir) {
  for (const std::string& name : leftover_folders(save_dir)) {
    const fs::path p = save_dir / name;
    const bool old = name.starts_with(".old_");
    const fs::path original = save_dir / name.substr(5);  // ".old_iter_N" -> "iter_N"
    std::error_code ec;
    if (old && !fs::exists(original, ec)) {
      // A re-save of iteration N stopped between moving the complete folder aside and renaming
      // the new one into place: the aside copy is the only complete one. Put it back.
      fs::rename(p, original, ec);
      if (!ec) {
        log_warn("restored ", original.string(), " from ", p.string(),
                 " (left by a save of that iteration that was interrupted)");
        continue;
      }
    }
    fs::remove_all(p, ec);
    if (ec)
      log_warn("could not remove ", p.string(), " (left by an interrupted save): ", ec.message());
    else
      log_warn("removed ", p.string(), ", an incomplete checkpoint left by an interrupted save");
  }
}

}  // namespace detail

}  // namespace megatron::training
