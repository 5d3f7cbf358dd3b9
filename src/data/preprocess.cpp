// The preprocess-data pipeline (see preprocess.h): reader thread, worker threads, ordered writer.
#include "data/preprocess.h"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/indexed_dataset.h"
#include "data/preprocess_batch.h"
#include "data/sentence_splitter.h"

namespace megatron::data {

// More tokenizing threads than this only add memory and contention.
constexpr int kMaxWorkers = 1024;

namespace {

using Clock = std::chrono::steady_clock;

struct DocResult {
  std::string error;  // non-empty: the record is bad
  std::vector<std::vector<int32_t>> tokens;   // per key
  std::vector<std::vector<int32_t>> lengths;  // per key: sequence (sentence) lengths
};

struct ResultBatch {
  std::vector<DocResult> docs;
  uint64_t input_bytes = 0;
};

constexpr size_t kReadChunk = 4 << 20;
constexpr size_t kBatchBytes = 1 << 20;
constexpr size_t kBatchRecords = 512;

std::string json_type_name(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number()) return "number";
  if (v.is_object()) return "object";
  if (v.is_array()) return "list";
  return "string";
}

class Pipeline {
 public:
  Pipeline(const PreprocessOptions& o, const Tokenizer& tok, InputFormat format,
           std::vector<std::string> files)
      : opt_(o), tok_(tok), format_(format), files_(std::move(files)) {
    if (o.append_eod) eod_ = tok.eod_or_throw();
  }
  ~Pipeline() { shutdown(); }

  void start() {
    try {
      reader_ = std::thread([this] { run_reader(); });
      for (int w = 0; w < opt_.workers; ++w) workers_.emplace_back([this] { run_worker(); });
    } catch (const std::system_error& e) {
      shutdown();
      MG_THROW("could not start ", opt_.workers, " worker threads (", e.what(),
               "); lower --workers");
    }
  }

  // Blocks until the next batch in input order is done; returns false at the end of input.
  bool next(ResultBatch& out) {
    std::unique_lock lock(mu_);
    while (!cv_out_.wait_for(lock, std::chrono::milliseconds(100), [&] {
      return stop_ || reader_error_ || results_.count(next_seq_) ||
             (reader_done_ && next_seq_ == batches_pushed_);
    })) {
      MG_REQUIRE(!stop_requested(), "interrupted; no output was written");
    }
    if (reader_error_) std::rethrow_exception(reader_error_);
    auto it = results_.find(next_seq_);
    if (it == results_.end()) return false;
    out = std::move(it->second);
    results_.erase(it);
    ++next_seq_;
    --in_flight_;
    cv_space_.notify_one();
    return true;
  }

  void shutdown() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_in_.notify_all();
    cv_space_.notify_all();
    cv_out_.notify_all();
    if (reader_.joinable()) reader_.join();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

 private:
  bool stop_requested() const { return opt_.stop_requested && opt_.stop_requested->load(); }

  // ---- reader: splits the file into records, batches them, respects the in-flight bound.
  void run_reader() {
    try {
      if (format_ == InputFormat::Parquet) {
        read_parquet_batches(
            files_, opt_.json_keys, kBatchBytes, kBatchRecords, [this](Batch& b) { return push(b); },
            [this] { return stop_requested(); });
      } else {
        for (uint32_t f = 0; f < files_.size(); ++f) {
          const int fd = ::open(files_[f].c_str(), O_RDONLY | O_CLOEXEC);
          MG_REQUIRE(fd >= 0, "cannot open --input ", files_[f], ": ", std::strerror(errno));
          struct FdCloser {
            int fd;
            ~FdCloser() { ::close(fd); }
          } closer{fd};
          if (!read_records(fd, f)) break;
        }
      }
      std::lock_guard lock(mu_);
      reader_done_ = true;
    } catch (...) {
      std::lock_guard lock(mu_);
      reader_error_ = std::current_exception();
      reader_done_ = true;
    }
    cv_in_.notify_all();
    cv_out_.notify_all();
  }

  bool push(Batch& b) {
    std::unique_lock lock(mu_);
    cv_space_.wait(lock, [&] { return stop_ || in_flight_ < 4 * size_t(opt_.workers) + 2; });
    if (stop_) return false;
    b.seq = batches_pushed_++;
    ++in_flight_;
    queue_.push_back(std::move(b));
    b = Batch();
    cv_in_.notify_one();
    return true;
  }

  // Reads one text/JSONL file into batches; false when the run is stopping.
  bool read_records(int fd, uint32_t file) {
    std::vector<char> chunk(kReadChunk);
    Batch batch;
    std::string line;          // the current line, possibly spanning chunks
    uint64_t line_offset = 0;  // file offset of `line`
    uint64_t offset = 0;       // file offset of chunk[0]
    int64_t line_no = 1;
    // Paragraph mode: the open block inside batch.data.
    bool block_open = false;
    Record block{};

    auto finish_record = [&](Record r, uint64_t consumed) {
      batch.records.push_back(r);
      batch.input_bytes += consumed;
      return batch.data.size() >= kBatchBytes || batch.records.size() >= kBatchRecords;
    };
    // Handles one complete line (without '\n'); `consumed` counts its bytes plus the newline.
    auto on_line = [&](uint64_t consumed) -> bool {
      bool full = false;
      if (format_ == InputFormat::TextParagraphs) {
        bool blank = line.find_first_not_of(" \t\r\f\v") == std::string::npos;
        if (blank) {
          if (block_open) {
            block.end = batch.data.size();
            block_open = false;
            full = finish_record(block, consumed);
          } else {
            batch.input_bytes += consumed;
          }
        } else {
          if (!block_open) {
            block = Record{batch.data.size(), 0, line_no, line_offset, file};
            block_open = true;
          } else {
            batch.data.push_back('\n');
          }
          batch.data += line;
          batch.input_bytes += consumed;
        }
      } else {
        size_t len = line.size();
        if (format_ == InputFormat::TextLines && len && line[len - 1] == '\r') --len;
        Record r{batch.data.size(), batch.data.size() + len, line_no, line_offset, file};
        batch.data.append(line, 0, len);
        full = finish_record(r, consumed);
      }
      ++line_no;
      line.clear();
      return full && !block_open;
    };

    for (;;) {
      if (stop_requested()) return false;
      // Wait in short slices so an interrupt is seen even on a pipe that stays silent.
      pollfd pfd{fd, POLLIN, 0};
      int ready = ::poll(&pfd, 1, 100);
      if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
      ssize_t n = ::read(fd, chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      MG_REQUIRE(n >= 0, "cannot read ", files_[file], ": ", std::strerror(errno));
      if (n == 0) break;
      const char* p = chunk.data();
      const char* end = p + n;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
        const char* stop = nl ? nl : end;
        if (line.empty()) line_offset = offset + uint64_t(p - chunk.data());
        line.append(p, size_t(stop - p));
        if (!nl) break;
        p = nl + 1;
        if (on_line(line.size() + 1) && !push(batch)) return false;
      }
      offset += uint64_t(n);
    }
    if (!line.empty()) on_line(line.size());
    if (block_open) {
      block.end = batch.data.size();
      block_open = false;
      finish_record(block, 0);
    }
    if (!batch.records.empty() || batch.input_bytes) return push(batch);
    return true;
  }

  // ---- workers
  void run_worker() {
    for (;;) {
      Batch b;
      {
        std::unique_lock lock(mu_);
        cv_in_.wait(lock, [&] { return stop_ || !queue_.empty() || reader_done_; });
        if (stop_ || queue_.empty()) return;
        b = std::move(queue_.front());
        queue_.pop_front();
      }
      ResultBatch r;
      r.input_bytes = b.input_bytes;
      r.docs.resize(b.records.size());
      for (size_t i = 0; i < b.records.size(); ++i) {
        const Record& rec = b.records[i];
        std::string_view text(b.data.data() + rec.begin, rec.end - rec.begin);
        try {
          if (format_ == InputFormat::Parquet)
            process_row(b, i, r.docs[i]);
          else
            process_record(text, rec, r.docs[i]);
        } catch (const std::exception& e) {
          r.docs[i] = DocResult();
          r.docs[i].error = str(where(rec), ": ", e.what());
        }
      }
      {
        std::lock_guard lock(mu_);
        results_.emplace(b.seq, std::move(r));
      }
      cv_out_.notify_all();
    }
  }

  void encode_value(const std::vector<std::string_view>& sentences, DocResult& doc) {
    auto& ids = doc.tokens.emplace_back();
    auto& lens = doc.lengths.emplace_back();
    for (std::string_view s : sentences) {
      const size_t before = ids.size();
      tok_.encode(s, ids);
      if (ids.size() > before) lens.push_back(int32_t(ids.size() - before));
    }
    if (!ids.empty() && eod_) {
      ids.push_back(*eod_);
      lens.back() += 1;
    }
  }

  void encode_text(std::string_view text, DocResult& doc) {
    if (opt_.split_sentences)
      encode_value(split_sentences(text, opt_.keep_newlines), doc);
    else
      encode_value({text}, doc);
  }

  // "FILE:LINE" of a record ("FILE: row N" for Parquet).
  std::string where(const Record& rec) const {
    if (format_ == InputFormat::Parquet) return str(files_[rec.file], ": row ", rec.line);
    return str(files_[rec.file], ":", rec.line);
  }

  // A Parquet row: one value per --json-keys column.
  void process_row(const Batch& b, size_t i, DocResult& doc) {
    const Record& rec = b.records[i];
    const size_t keys = opt_.json_keys.size();
    size_t begin = 0;
    for (size_t k = 0; k < keys; ++k) {
      const size_t end = b.field_ends[i * keys + k];
      if (b.field_null[i * keys + k]) {
        doc = DocResult();
        doc.error = str(where(rec), ": column '", opt_.json_keys[k], "' is null");
        return;
      }
      std::string_view text(b.data.data() + rec.begin + begin, end - begin);
      begin = end;
      const size_t bad = find_invalid_utf8(text);
      if (bad != std::string_view::npos) {
        doc = DocResult();
        doc.error = str(where(rec), ": column '", opt_.json_keys[k],
                        "' holds invalid UTF-8 at byte ", bad + 1, " of the value");
        return;
      }
      encode_text(text, doc);
    }
  }

  void process_record(std::string_view text, const Record& rec, DocResult& doc) {
    size_t bad = find_invalid_utf8(text);
    if (bad != std::string_view::npos) {
      // Column counts bytes from 1 in the record's first line (paragraphs: may be a later line).
      doc.error = str(where(rec), ": invalid UTF-8 at byte offset ",
                      rec.file_offset + bad, " of the file (byte ", bad + 1,
                      " of the record); the input must be UTF-8");
      return;
    }
    if (format_ != InputFormat::Jsonl) {
      encode_text(text, doc);
      return;
    }
    nlohmann::json storage;
    std::vector<JsonlValue> values;
    const std::string error = parse_jsonl_record(text, opt_.json_keys, storage, values);
    if (!error.empty()) {
      doc.error = str(where(rec), ": ", error);
      return;
    }
    for (const JsonlValue& v : values) {
      if (v.list) encode_value(v.sentences, doc);  // already split: one sentence per element
      else encode_text(v.sentences[0], doc);
    }
  }

  const PreprocessOptions& opt_;
  const Tokenizer& tok_;
  InputFormat format_;
  std::vector<std::string> files_;
  std::optional<int32_t> eod_;
  std::thread reader_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_in_, cv_space_, cv_out_;
  std::deque<Batch> queue_;
  std::map<uint64_t, ResultBatch> results_;
  std::exception_ptr reader_error_;
  bool stop_ = false, reader_done_ = false;
  uint64_t batches_pushed_ = 0, next_seq_ = 0;
  size_t in_flight_ = 0;
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

InputFormat input_format_from_name(const std::string& name) {
  if (name == "auto") return InputFormat::Auto;
  if (name == "jsonl") return InputFormat::Jsonl;
  if (name == "text-lines") return InputFormat::TextLines;
  if (name == "text-paragraphs") return InputFormat::TextParagraphs;
  if (name == "parquet") return InputFormat::Parquet;
  MG_THROW("--input-format must be auto, jsonl, text-lines, text-paragraphs or parquet, got '",
           name, "'");
}

std::string parse_jsonl_record(std::string_view line, const std::vector<std::string>& keys,
                               nlohmann::json& storage, std::vector<JsonlValue>& values) {
  values.clear();
  try {
    storage = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return str("malformed JSON: ", e.what());
  }
  if (!storage.is_object()) return str("expected a JSON object, found a ", json_type_name(storage));
  for (const std::string& key : keys) {
    auto it = storage.find(key);
    if (it == storage.end()) return str("missing key '", key, "' (select keys with --json-keys)");
    auto& value = values.emplace_back();
    auto& sentences = value.sentences;
    if (it->is_string()) {
      sentences.push_back(it->get_ref<const std::string&>());
    } else if (it->is_array()) {
      value.list = true;
      for (const auto& s : *it) {
        if (!s.is_string())
          return str("key '", key, "' is a list holding a ", json_type_name(s),
                     "; expected a string or a list of strings");
        sentences.push_back(s.get_ref<const std::string&>());
      }
    } else {
      return str("key '", key, "' has a ", json_type_name(*it),
                 " value; expected a string or a list of strings");
    }
  }
  return {};
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return i;
    i += len;
  }
  return std::string_view::npos;
}

std::vector<std::string> preprocess_output_prefixes(const PreprocessOptions& o) {
  std::vector<std::string> out;
  const char* level = o.split_sentences ? "sentence" : "document";
  for (const auto& key : o.json_keys) out.push_back(str(o.output_prefix, "_", key, "_", level));
  return out;
}

std::vector<std::string> expand_input(const std::string& input) {
  MG_REQUIRE(!input.empty(), "--input is required");
  if (input.find_first_of("*?[") == std::string::npos) return {input};
  glob_t g{};
  const int rc = ::glob(input.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  MG_REQUIRE(!files.empty(), "--input '", input, "' matches no file");
  return files;  // glob() sorts its matches
}

PreprocessStats preprocess_data(const PreprocessOptions& o, const Tokenizer& tokenizer) {
  MG_REQUIRE(!o.input.empty(), "--input is required");
  MG_REQUIRE(!o.output_prefix.empty(), "--output-prefix is required");
  MG_REQUIRE(!o.json_keys.empty(), "--json-keys needs at least one key");
  MG_REQUIRE(o.workers >= 1, "--workers must be >= 1, got ", o.workers);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  MG_REQUIRE(o.workers <= kMaxWorkers, "--workers ", o.workers, " is more threads than is useful: "
             "use at most ", kMaxWorkers, " (this machine has ", cores, " cores; --workers ", cores,
             " keeps them all busy)");
  MG_REQUIRE(o.log_interval >= 1, "--log-interval must be >= 1, got ", o.log_interval);
  const std::vector<std::string> files = expand_input(o.input);
  auto ends_with = [](const std::string& s, const char* suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
  };
  InputFormat format = o.input_format;
  if (format == InputFormat::Auto) {
    const std::string& in = files[0];
    format = ends_with(in, ".parquet") ? InputFormat::Parquet
             : ends_with(in, ".txt")   ? InputFormat::TextLines
                                       : InputFormat::Jsonl;
  }
  MG_REQUIRE(format == InputFormat::Jsonl || format == InputFormat::Parquet ||
                 o.json_keys.size() == 1,
             "plain-text input has one text per document; give at most one --json-keys name "
             "(it names the output), got ", o.json_keys.size());
  // Pipes have no size: no ETA then.
  double file_size = 0;
  for (const std::string& f : files) {
    MG_REQUIRE(!ends_with(f, ".gz"), "compressed input ", f,
               " is not supported; decompress it first (gunzip)");
    struct stat st {};
    MG_REQUIRE(::stat(f.c_str(), &st) == 0, "cannot open --input ", f, ": ", std::strerror(errno));
    MG_REQUIRE(!S_ISDIR(st.st_mode), "--input ", f,
               " is a folder; give a JSONL, text or Parquet file (or a glob such as 'dir/*.parquet')");
    MG_REQUIRE(::access(f.c_str(), R_OK) == 0, "cannot open --input ", f, ": ", std::strerror(errno));
    file_size = S_ISREG(st.st_mode) && file_size >= 0 ? file_size + double(st.st_size) : -1.0;
    if (S_ISREG(st.st_mode) && st.st_size == 0 && format != InputFormat::Parquet)
      log_warn("input ", f, " is empty", files.size() == 1 ? "; writing an empty dataset (0 documents)" : "");
  }

  PreprocessStats stats;
  stats.output_prefixes = preprocess_output_prefixes(o);
  const IndexDType dtype = optimal_token_dtype(tokenizer.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& p : stats.output_prefixes)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(p, dtype));

  const auto t0 = Clock::now();
  ProgressLine live(o.progress);  // on a terminal; plain lines every --log-interval documents
  int64_t next_log = o.log_interval;
  auto progress_line = [&](double elapsed) {
    elapsed = std::max(elapsed, 1e-9);
    double mb = double(stats.input_bytes) / 1e6;
    double rate = elapsed > 0 ? double(stats.input_bytes) / elapsed : 0;
    double eta = rate > 0 && file_size >= 0 ? (file_size - double(stats.input_bytes)) / rate : -1;
    return str("processed ", stats.documents, " documents (", fixed(stats.documents / elapsed, 0),
               " docs/s, ", fixed(mb / elapsed, 2), " MB/s, ", fixed(stats.tokens / elapsed, 0),
               " tokens/s), ", fixed(file_size > 0 ? 100.0 * stats.input_bytes / file_size : 100, 1),
               "%, ETA ", format_duration(eta));
  };

  Pipeline pipeline(o, tokenizer, format, files);
  pipeline.start();
  ResultBatch batch;
  int64_t skip_warnings = 0;
  while (pipeline.next(batch)) {
    MG_REQUIRE(!(o.stop_requested && o.stop_requested->load()),
               "interrupted; no output was written");
    for (DocResult& doc : batch.docs) {
      if (!doc.error.empty()) {
        MG_REQUIRE(o.skip_errors, doc.error, " (use --on-error skip to skip bad records)");
        ++stats.skipped;
        if (++skip_warnings <= 10) log_warn("skipping ", doc.error);
        continue;
      }
      int64_t doc_tokens = 0;
      for (size_t k = 0; k < builders.size(); ++k) {
        builders[k]->add_document(doc.tokens[k], doc.lengths[k]);
        doc_tokens += int64_t(doc.tokens[k].size());
      }
      stats.tokens += doc_tokens;
      stats.empty += doc_tokens == 0;
      ++stats.documents;
    }
    stats.input_bytes += int64_t(batch.input_bytes);
    if (!o.progress) continue;
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    if (live.live()) {
      if (live.due()) live.update(progress_line(elapsed));
    } else if (stats.documents >= next_log) {
      log_info(progress_line(elapsed));
      next_log = (stats.documents / o.log_interval + 1) * o.log_interval;
    }
  }
  MG_REQUIRE(!(o.stop_requested && o.stop_requested->load()), "interrupted; no output was written");
  pipeline.shutdown();
  live.finish();
  for (auto& b : builders) b->finalize();
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (skip_warnings > 10) log_warn(skip_warnings - 10, " more bad records were skipped");
  return stats;
}

}  // namespace megatron::data
