// The command lines of Megatron-LM's GPT tutorials, run unchanged except the launcher (python /
// torchrun / python -m torch.distributed.launch -> megatron launch, or megatron alone for one
// process) and the shapes (layers, widths, batch sizes, iterations and intervals scaled down to a
// test): each trains, saves, and resumes from its checkpoint. The tutorials are
//   - Megatron-LM's examples/pretrain_gpt.sh, the GPT-345M walkthrough (one GPU, older flags);
//   - examples/gpt3/train_gpt3_857m_distributed.sh and _175b_ (torchrun, tensor parallel);
//   - the Ascend port's GPT script (torch.distributed.launch, pipeline parallel, fused-attention
//     flags);
//   - the MindSpeed quick start (torchrun, tensor + sequence parallel, distributed optimizer);
//   - the flags of Megatron-LM's current example scripts.
// Where Megatron-LM itself refuses a tutorial's line (the GPT-3 175B script's batch-size ramp-up
// with --train-iters) this build does too, naming the flag.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "cli/cli_fixture.h"
#include "comm/communicator.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

// $DATA, $VOCAB, $MERGE, $CKPT and $TB replaced by the fixture's files and `dir`'s folders.
std::string expand(std::string line, const TempDir& dir) {
  const auto& f = cli_fixture();
  const std::pair<const char*, std::string> vars[] = {
      {"$DATA", f.data_prefix}, {"$VOCAB", f.vocab_file}, {"$MERGE", f.merge_file},
      {"$CKPT", (dir / "ckpt").string()}, {"$TB", (dir / "tb").string()}};
  for (const auto& [name, value] : vars)
    for (size_t p = line.find(name); p != std::string::npos; p = line.find(name, p + value.size()))
      line.replace(p, std::string(name).size(), value);
  return line;
}

// The start of Megatron's log line for `iteration` of `total`.
std::string str_iteration(int iteration, int total) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "iteration %8d/%8d |", iteration, total);
  return buf;
}

// Runs the line with --exit-interval HALF (training stops and saves there), then unchanged (it
// resumes from that checkpoint and trains to --train-iters TOTAL).
void trains_saves_and_resumes(const std::string& line, int half, int total) {
  TempDir dir;
  const std::string cmd = expand(line, dir);
  auto first = run_cli(cmd + " --exit-interval " + std::to_string(half) + " 2>&1");
  ASSERT_EQ(first.exit_code, 0) << cmd << "\n" << first.output;
  const std::string last_first = str_iteration(half, total);
  EXPECT_NE(first.output.find(last_first), std::string::npos) << first.output;
  char tracker[64];
  std::snprintf(tracker, sizeof tracker, "%d", half);
  EXPECT_EQ(read_file(dir / "ckpt" / "latest_checkpointed_iteration.txt"), tracker);
  auto second = run_cli(cmd + " 2>&1");
  ASSERT_EQ(second.exit_code, 0) << cmd << "\n" << second.output;
  EXPECT_NE(second.output.find("loading checkpoint from " + (dir / "ckpt").string() +
                               " at iteration " + std::to_string(half)),
            std::string::npos) << second.output;
  EXPECT_EQ(second.output.find(str_iteration(1, total)), std::string::npos) << second.output;
  EXPECT_NE(second.output.find(str_iteration(total, total)), std::string::npos) << second.output;
  std::snprintf(tracker, sizeof tracker, "%d", total);
  EXPECT_EQ(read_file(dir / "ckpt" / "latest_checkpointed_iteration.txt"), tracker);
}

bool can_launch() { return !launched_under_mpi(); }

// examples/pretrain_gpt.sh: `python pretrain_gpt.py ...` (the 345M walkthrough; older flags:
// --data-impl, --distributed-backend, --checkpoint-activations).
TEST(MegatronTutorials, Gpt345mWalkthrough) {
  trains_saves_and_resumes(
      "pretrain-gpt"
      " --num-layers 2 --hidden-size 16 --num-attention-heads 2"
      " --micro-batch-size 2 --global-batch-size 4 --seq-length 16 --max-position-embeddings 16"
      " --train-iters 4 --lr-decay-iters 4"
      " --save $CKPT --load $CKPT --data-path $DATA"
      " --vocab-file $VOCAB --merge-file $MERGE --data-impl mmap --split 949,50,1"
      " --distributed-backend nccl --lr 0.00015 --min-lr 1.0e-5 --lr-decay-style cosine"
      " --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 --checkpoint-activations"
      " --log-interval 1 --save-interval 4 --eval-interval 2 --eval-iters 1 --fp16",
      2, 4);
}

// examples/gpt3/train_gpt3_857m_distributed.sh: `torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py`.
TEST(MegatronTutorials, Gpt3TorchrunTensorParallel) {
  if (!can_launch()) GTEST_SKIP() << "launches its own job";
  trains_saves_and_resumes(
      "launch --nproc_per_node 2 --nnodes 1 --master_addr localhost --master_port 6000"
      " pretrain_gpt.py"
      " --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
      " --max-position-embeddings 16 --attention-backend auto"
      " --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --weight-decay 0.1"
      " --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16"
      " --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001"
      " --lr-decay-iters 4"
      " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1"
      " --data-path $DATA --vocab-file $VOCAB --merge-file $MERGE --split 949,50,1"
      " --log-interval 1 --save-interval 4 --eval-interval 2 --save $CKPT --load $CKPT"
      " --eval-iters 1 --tensorboard-dir $TB",
      2, 4);
}

// The Ascend port's GPT script: `python -m torch.distributed.launch $DISTRIBUTED_ARGS
// pretrain_gpt.py` with its fused-attention flags (--pre-tockens/--next-tockens at their defaults:
// causal attention).
TEST(MegatronTutorials, AscendGptPipelineParallel) {
  if (!can_launch()) GTEST_SKIP() << "launches its own job";
  trains_saves_and_resumes(
      "launch --nproc_per_node 2 --nnodes 1 --node_rank 0 --master_addr localhost"
      " --master_port 6000 pretrain_gpt.py"
      " --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2"
      " --num-layers 2 --hidden-size 16 --num-attention-heads 2 --micro-batch-size 1"
      " --global-batch-size 4 --seq-length 16 --max-position-embeddings 16 --train-iters 4"
      " --lr-decay-iters 4 --save $CKPT --load $CKPT --data-path $DATA"
      " --vocab-file $VOCAB --merge-file $MERGE --data-impl mmap --split 949,50,1"
      " --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine --min-lr 1.0e-5"
      " --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01"
      " --log-interval 1 --save-interval 4 --eval-interval 2 --eval-iters 1"
      " --initial-loss-scale 65536 --fp16 --use-flash-attn --pre-tockens 65536 --next-tockens 0"
      " --shape-order SBH --no-masked-softmax-fusion --attention-softmax-in-fp32"
      " --no-gradient-accumulation-fusion --use-cpu-initialization"
      " --recompute-granularity full --recompute-method uniform",
      2, 4);
}

// The MindSpeed quick start: torchrun, Megatron-Core models with the local implementation,
// tensor + sequence parallel, distributed optimizer with overlapped reduce and gather, bf16.
TEST(MegatronTutorials, MindSpeedQuickStart) {
  if (!can_launch()) GTEST_SKIP() << "launches its own job";
  trains_saves_and_resumes(
      "launch --nproc_per_node 2 --nnodes 1 --node_rank 0 --master_addr localhost"
      " --master_port 6000 pretrain_gpt.py"
      " --use-mcore-models --transformer-impl local --tensor-model-parallel-size 2"
      " --pipeline-model-parallel-size 1 --sequence-parallel --num-layers 2 --hidden-size 16"
      " --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16"
      " --micro-batch-size 2 --global-batch-size 4 --make-vocab-size-divisible-by 1"
      " --lr 1.0e-4 --train-iters 4 --lr-decay-style cosine"
      " --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-fraction 0.01 --clip-grad 1.0"
      " --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.01 --use-flash-attn"
      " --no-masked-softmax-fusion --attention-softmax-in-fp32 --no-gradient-accumulation-fusion"
      " --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --bf16"
      " --data-path $DATA --vocab-file $VOCAB --merge-file $MERGE --split 949,50,1"
      " --no-create-attention-mask-in-dataloader --num-workers 4"
      " --log-interval 1 --save-interval 4 --eval-interval 2 --eval-iters 1 --save $CKPT"
      " --load $CKPT --distributed-backend nccl",
      2, 4);
}

// examples/gpt3/train_gpt3_175b_distributed.sh: the 857M line plus --rampup-batch-size. The script
// passes --train-iters, which Megatron-LM itself refuses with a ramp-up ("expected no batch-size
// rampup for iteration-based training"): so does this build, naming the flag. With the length in
// samples (--train-samples 40, --lr-decay-samples 40) it ramps 2, 2, 2, 4, 4, 6, then 8 (8
// iterations: Megatron's update_train_iters), saves, and resumes.
TEST(MegatronTutorials, Gpt3_175bRampsUpTheBatchSize) {
  if (!can_launch()) GTEST_SKIP() << "launches its own job";
  const std::string line =
      "launch --nproc_per_node 2 --nnodes 1 --master_addr localhost --master_port 6000"
      " pretrain_gpt.py --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16"
      " --max-position-embeddings 16 --attention-backend auto --micro-batch-size 1"
      " --global-batch-size 8 --rampup-batch-size 2 2 16 LENGTH --weight-decay 0.1"
      " --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16"
      " --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001"
      " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1"
      " --data-path $DATA --vocab-file $VOCAB --merge-file $MERGE --split 949,50,1"
      " --log-interval 1 --save-interval 4 --eval-interval 2 --save $CKPT --load $CKPT"
      " --eval-iters 1 --tensorboard-dir $TB";
  auto with = [&](const std::string& length) {
    std::string l = line;
    l.replace(l.find("LENGTH"), 6, length);
    return l;
  };
  {
    TempDir dir;
    const auto r = run_cli(expand(with("--train-iters 4 --lr-decay-iters 4"), dir) + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("error: --rampup-batch-size needs sample-based training"),
              std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "ckpt"));
  }
  trains_saves_and_resumes(with("--train-samples 40 --lr-decay-samples 40"), 4, 8);
}

}  // namespace
}  // namespace megatron::testing
