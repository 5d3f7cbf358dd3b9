// TensorBoard event files, read (tfevents_reader.h).
#include "report/tfevents_reader.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "training/tensorboard.h"

namespace megatron::report {

namespace {

namespace fs = std::filesystem;

// A protobuf message being decoded: fields in order, by number and wire type.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;

  bool more() const { return ok && p < end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) {
        ok = false;
        return 0;
      }
      const uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
  template <class T>
  T fixed() {
    T v{};
    if (end - p < int64_t(sizeof(T))) {
      ok = false;
      return v;
    }
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (!ok || uint64_t(end - p) < n) {
      ok = false;
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p), size_t(n));
    p += n;
    return s;
  }
  void skip(int wire) {
    if (wire == 0)
      varint();
    else if (wire == 1)
      fixed<uint64_t>();
    else if (wire == 2)
      bytes();
    else if (wire == 5)
      fixed<uint32_t>();
    else
      ok = false;
  }
};

Reader reader_of(std::string_view s) {
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  return Reader{b, b + s.size()};
}

// TensorProto: float_val (5, packed or not) or tensor_content (4) holding one float.
bool tensor_value(std::string_view t, double& out) {
  Reader r = reader_of(t);
  while (r.more()) {
    const uint64_t key = r.varint();
    const int field = int(key >> 3), wire = int(key & 7);
    if (field == 5 && wire == 5) {
      out = r.fixed<float>();
      return r.ok;
    }
    if ((field == 5 || field == 4) && wire == 2) {
      const std::string_view v = r.bytes();
      if (v.size() >= 4) {
        float f;
        std::memcpy(&f, v.data(), 4);
        out = f;
        return r.ok;
      }
      continue;
    }
    r.skip(wire);
  }
  return false;
}

// Summary.Value: tag (1), simple_value (2), tensor (8).
void summary_value(std::string_view v, int64_t step, double wall, EventFile& f) {
  Reader r = reader_of(v);
  std::string tag;
  double value = 0;
  bool has = false;
  while (r.more()) {
    const uint64_t key = r.varint();
    const int field = int(key >> 3), wire = int(key & 7);
    if (field == 1 && wire == 2) {
      tag = std::string(r.bytes());
    } else if (field == 2 && wire == 5) {
      value = r.fixed<float>();
      has = true;
    } else if (field == 8 && wire == 2) {
      has = tensor_value(r.bytes(), value) || has;
    } else {
      r.skip(wire);
    }
  }
  if (r.ok && has && !tag.empty()) f.scalars[tag].push_back({step, value, wall});
}

// Event: wall_time (1), step (2), summary (5) of repeated Value (1).
bool event(std::string_view data, EventFile& f) {
  Reader r = reader_of(data);
  double wall = 0;
  int64_t step = 0;
  std::vector<std::string_view> summaries;
  while (r.more()) {
    const uint64_t key = r.varint();
    const int field = int(key >> 3), wire = int(key & 7);
    if (field == 1 && wire == 1)
      wall = r.fixed<double>();
    else if (field == 2 && wire == 0)
      step = int64_t(r.varint());
    else if (field == 5 && wire == 2)
      summaries.push_back(r.bytes());
    else
      r.skip(wire);
  }
  if (!r.ok) return false;
  for (std::string_view s : summaries) {
    Reader v = reader_of(s);
    while (v.more()) {
      const uint64_t key = v.varint();
      if ((key >> 3) == 1 && (key & 7) == 2)
        summary_value(v.bytes(), step, wall, f);
      else
        v.skip(int(key & 7));
    }
    if (!v.ok) return false;
  }
  return true;
}

uint64_t le64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

EventFile read_event_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MG_REQUIRE(in.good(), "cannot read TensorBoard event file ", path.string());
  const std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EventFile f;
  f.path = path;
  size_t at = 0;
  while (at < buf.size()) {
    if (buf.size() - at < 12) {
      f.truncated = true;
      break;
    }
    const uint64_t n = le64(buf.data() + at);
    MG_REQUIRE(
        le32(buf.data() + at + 8) == training::masked_crc32c(std::string_view(buf.data() + at, 8)),
        path.string(), ": the record at byte ", at,
        " has a wrong length checksum: not a TensorBoard event file, or damaged");
    if (buf.size() - at - 12 < n + 4) {
      f.truncated = true;
      break;
    }
    const std::string_view data(buf.data() + at + 12, size_t(n));
    MG_REQUIRE(le32(buf.data() + at + 12 + n) == training::masked_crc32c(data), path.string(),
               ": the record at byte ", at, " has a wrong data checksum (damaged file)");
    MG_REQUIRE(event(data, f), path.string(), ": the record at byte ", at,
               " is not a tensorflow.Event (damaged file)");
    ++f.records;
    at += 12 + n + 4;
  }
  return f;
}

std::map<std::string, std::vector<Scalar>> read_event_dir(const fs::path& dir,
                                                          std::vector<fs::path>* files) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) &&
        it->path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      found.push_back(it->path());
  std::sort(found.begin(), found.end());
  std::map<std::string, std::vector<Scalar>> out;
  for (const fs::path& p : found) {
    EventFile f = read_event_file(p);
    for (auto& [tag, v] : f.scalars) out[tag].insert(out[tag].end(), v.begin(), v.end());
  }
  for (auto& [tag, v] : out)
    std::stable_sort(v.begin(), v.end(),
                     [](const Scalar& a, const Scalar& b) { return a.step < b.step; });
  if (files) *files = found;
  return out;
}

}  // namespace megatron::report
