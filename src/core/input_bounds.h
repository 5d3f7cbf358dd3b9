// What a file or request can make the program allocate is checked before it is trusted:
//  - checked_shape_bytes: a shape read from a file, with its element count, byte count and
//    contiguous strides overflow-checked (a header may claim any sizes; only sizes that fit are
//    compared with the bytes present);
//  - allocation failures (std::bad_alloc, a container's std::length_error for an impossible size,
//    OutOfMemory from the host allocator) become a megatron::Error naming the input that asked
//    for the memory, never a bare C++ message: with_input() around a call, or
//    MG_CATCH_OUT_OF_MEMORY as the handlers of a function-try-block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"

namespace megatron {

// The bytes of a contiguous tensor of `shape` with `elem_size`-byte elements, or false when a
// dimension is negative or the byte count or a contiguous stride does not fit in int64.
bool checked_shape_bytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* bytes);

// An allocation the machine could not satisfy (thrown by the host allocator).
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& what) : Error(what) {}
};

// The Error for an allocation failure (`what`: the C++ exception's text) while reading `input`.
[[noreturn]] void throw_out_of_memory(const std::string& input, const char* what);

// Runs fn() and returns its result; an allocation failure inside becomes an Error naming `input`
// (the file or request whose contents asked for the memory).
template <typename Fn>
auto with_input(const std::string& input, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const OutOfMemory& e) {
    throw_out_of_memory(input, e.what());
  } catch (const std::bad_alloc& e) {
    throw_out_of_memory(input, e.what());
  } catch (const std::length_error& e) {
    throw_out_of_memory(input, e.what());
  }
}

}  // namespace megatron

// The handlers of a function-try-block that do what with_input() does for a whole function:
//   Tensor read(const std::string& file) try { ... } MG_CATCH_OUT_OF_MEMORY(file)
#define MG_CATCH_OUT_OF_MEMORY(input)                 \
  catch (const ::megatron::OutOfMemory& e) {          \
    ::megatron::throw_out_of_memory(input, e.what()); \
  }                                                   \
  catch (const std::bad_alloc& e) {                   \
    ::megatron::throw_out_of_memory(input, e.what()); \
  }                                                   \
  catch (const std::length_error& e) {                \
    ::megatron::throw_out_of_memory(input, e.what()); \
  }
