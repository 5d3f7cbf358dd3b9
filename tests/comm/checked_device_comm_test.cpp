// Collectives, tensor-parallel mappings and vocab-parallel cross entropy with tensors on the
// checking device (host code cannot touch their memory outside ops and explicit copies): the
// communicators stage them through host copies, and every result equals the same call on CPU
// tensors bit for bit, on the same device as its input. Mpi* tests: world of one and mpirun -np 2/4.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/communicator.h"
#include "comm/tp_mappings.h"
#include "comm/vocab_parallel_cross_entropy.h"
#include "test_util.h"

namespace megatron {
namespace {

using megatron::testing::checked_device;

// Distinct values per rank and element.
Tensor rank_values(const Shape& s, int rank, DType dt = DType::F32) {
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(rank) * 0.75f + float(i % 97) * 0.125f - 3.0f;
  return Tensor::from_vector(v, s).to(dt);
}

// got (any device) equals want (CPU) byte for byte, and lives on `device`.
void expect_same(const Tensor& got, const Tensor& want, Device device, const std::string& what) {
  EXPECT_EQ(got.device(), device) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const Tensor g = got.to(Device::cpu()), w = want.contiguous();
  EXPECT_EQ(0, std::memcmp(g.raw_data(), w.raw_data(), w.nbytes())) << what;
}

// Runs f(device) on the CPU and on the checking device; f returns its results.
template <typename F>
void compare_devices(const std::string& what, F&& f) {
  const std::vector<Tensor> want = f(Device::cpu());
  const std::vector<Tensor> got = f(checked_device());
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) expect_same(got[i], want[i], checked_device(), what + " #" + std::to_string(i));
}

void collectives(Communicator& c) {
  const int r = c.rank(), n = c.size();
  for (DType dt : {DType::F32, DType::BF16})
    compare_devices(str(c.name(), " all_reduce ", dtype_name(dt)), [&](Device d) {
      Tensor x = rank_values({5, 3}, r, dt).to(d);
      c.all_reduce(x, ReduceOp::Sum);
      Tensor m = rank_values({4}, r, dt).to(d);
      c.all_reduce(m, ReduceOp::Max);
      return std::vector<Tensor>{x, m};
    });
  compare_devices(str(c.name(), " all_gather, in place, reduce_scatter (bf16)"), [&](Device d) {
    Tensor out = Tensor::empty({2 * n, 3}, DType::F32, d);
    c.all_gather(rank_values({2, 3}, r).to(d), out);
    Tensor buf = Tensor::full({n * 4}, -1.0, DType::F32, d);
    buf.narrow(0, r * 4, 4).copy_(rank_values({4}, r));
    c.all_gather_inplace(buf);
    Tensor rs = Tensor::empty({3}, DType::BF16, d);
    c.reduce_scatter(rank_values({n * 3}, r, DType::BF16).to(d), rs, ReduceOp::Sum);
    return std::vector<Tensor>{out, buf, rs};
  });
  compare_devices(str(c.name(), " broadcast, send/recv"), [&](Device d) {
    Tensor b = rank_values({6}, r).to(d);
    c.broadcast(b, n - 1);
    Tensor got = Tensor::zeros({2}, DType::I64, d);
    if (n > 1) {
      CommHandle hr = c.recv_async(got, (r + n - 1) % n, 3);
      c.send(Tensor::from_vector<int64_t>({r, 100 + r}, {2}, d), (r + 1) % n, 3);
      hr.wait();
    }
    return std::vector<Tensor>{b, got};
  });
  compare_devices(str(c.name(), " all_to_all_v (bf16, uneven), all_to_all"), [&](Device d) {
    std::vector<int64_t> sc, rc;  // rank i sends i + j + 1 elements to rank j
    for (int j = 0; j < n; ++j) {
      sc.push_back(r + j + 1);
      rc.push_back(j + r + 1);
    }
    int64_t rn = 0;
    for (int64_t v : rc) rn += v;
    Tensor out = Tensor::empty({rn}, DType::BF16, d);
    c.all_to_all_v(rank_values({n * (n + 1) / 2 + n * r}, r, DType::BF16).to(d), sc, out, rc);
    Tensor eq = Tensor::empty({n, 2}, DType::F32, d);
    c.all_to_all(rank_values({n, 2}, r).to(d), eq);
    return std::vector<Tensor>{out, eq};
  });
}

TEST(MpiCheckedComm, CollectivesStageThroughHostCopies) {
  collectives(*world_communicator());
  collectives(*make_self_communicator());
}

TEST(MpiCheckedComm, TensorParallelMappingsStayOnTheDevice) {
  auto w = world_communicator();
  const int r = w->rank(), n = w->size();
  compare_devices("scatter/gather along the last dimension", [&](Device d) {
    const Tensor full = rank_values({2, 3, 2 * n}, 0).to(d);
    const Tensor part = tp::scatter_to_tensor_model_parallel_region(*w, full);
    const Tensor all = tp::gather_from_tensor_model_parallel_region(*w, rank_values({3, 2}, r).to(d));
    return std::vector<Tensor>{part, all};
  });
  compare_devices("sequence parallel gather and reduce-scatter", [&](Device d) {
    const Tensor x = rank_values({2 * n, 3}, r, DType::BF16).to(d);
    return std::vector<Tensor>{tp::gather_from_sequence_parallel_region(*w, x.narrow(0, 0, 2).contiguous()),
                               tp::reduce_scatter_to_sequence_parallel_region(*w, x),
                               tp::scatter_to_sequence_parallel_region(*w, x),
                               tp::reduce_from_tensor_model_parallel_region(*w, x)};
  });
}

TEST(MpiCheckedComm, VocabParallelCrossEntropyOnTheDevice) {
  auto w = world_communicator();
  const int64_t tokens = 7, vl = 6;
  compare_devices("forward and backward", [&](Device d) {
    const Tensor logits = rank_values({tokens, vl}, w->rank()).to(d);
    std::vector<int32_t> tgt;
    for (int64_t i = 0; i < tokens; ++i) tgt.push_back(int32_t((i * 5 + 2) % (vl * w->size())));
    VocabParallelCrossEntropy::Saved saved;
    const Tensor loss = VocabParallelCrossEntropy::forward(
        *w, logits, Tensor::from_vector(tgt, {tokens}, d), saved, 0.1f);
    const Tensor grad = VocabParallelCrossEntropy::backward(saved, rank_values({tokens}, 1).to(d));
    return std::vector<Tensor>{loss, grad};
  });
}

}  // namespace
}  // namespace megatron
