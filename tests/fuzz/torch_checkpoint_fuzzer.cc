// libFuzzer target for the readers of PyTorch checkpoints: the ZIP reader (core/zip_archive.h),
// the restricted unpickler (core/pickle.h) and PyTorch files in both formats (core/torch_file.h).
// The first input byte picks the entry point: even -> the rest is a pickle; odd -> the rest is a
// whole .pt file (zip or legacy format), whose tensors are then all read. Every object of the
// resulting tree is visited once (shared subtrees and cycles included). A megatron::Error is the
// expected answer to a bad input; anything else (a crash, a sanitizer report, an InternalError, a
// leak, an allocation beyond libFuzzer's -rss_limit_mb) is a bug.
// Built and run by tests/fuzz/run_torch_checkpoint_fuzzer.sh (not by CMake; .cc keeps it out of
// the tests' *.cpp glob).
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_set>

#include "core/error.h"
#include "core/pickle.h"
#include "core/torch_file.h"

namespace {

volatile size_t g_sink = 0;  // keeps the visits from being optimized away
using megatron::pickle::Kind;
using megatron::pickle::Value;

// Visits every object once; reads every tensor of a file.
void visit(const Value* v, const megatron::TorchFile* file, std::unordered_set<const Value*>& seen,
           size_t& sink) {
  std::vector<const Value*> todo{v};
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    if (x == nullptr || !seen.insert(x).second) continue;
    sink += x->describe().size();
    if (x->kind == Kind::Tensor && file != nullptr) {
      try {
        const megatron::Tensor t = file->tensor(*x);
        sink += size_t(t.numel());
      } catch (const megatron::Error&) {
      }
    }
    for (const Value* c : x->items) todo.push_back(c);
    for (const auto& [k, val] : x->entries) {
      todo.push_back(k);
      todo.push_back(val);
    }
    if (x->kind == Kind::Dict || x->kind == Kind::Namespace) {  // the lookups consumers make
      sink += x->get("model") != nullptr;
      sink += x->get(int64_t(0)) != nullptr;
    }
    if (x->storage != nullptr) todo.push_back(x->storage);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  std::unordered_set<const Value*> seen;
  size_t sink = 0;
  try {
    if (data[0] % 2 == 0) {
      const megatron::pickle::Document doc = megatron::pickle::unpickle(rest, "fuzz.pkl");
      visit(doc.root, nullptr, seen, sink);
    } else {
      const megatron::TorchFile f = megatron::TorchFile::from_memory(rest, "fuzz.pt");
      visit(&f.root(), &f, seen, sink);
    }
  } catch (const megatron::Error&) {
  }
  g_sink = sink;
  return 0;
}
