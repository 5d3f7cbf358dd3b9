// `megatron evaluate`: zero-shot evaluation as Megatron-LM's tasks/main.py --task LAMBADA |
// WIKITEXT103 (inference/evaluate.h), on any checkpoint generate and serve load (sharded or
// not), with the model and tokenizer flags of generate (or --use-checkpoint-args). Prints
// Megatron's lines: the dataset summary, "> working on iteration: N" every --log-interval
// micro-batches (with samples done and the rate), and the result between dashes. Under an MPI
// job (megatron launch --nproc_per_node N, as Megatron's scripts run it) the ranks are data
// parallel: rank r scores samples r, r + N, ..., the totals are summed, and rank 0 prints.
//
// On a BERT checkpoint (pretrain-bert's; its metadata names the family) it scores the masked-LM
// and sentence-order heads on a split of pretrain-bert's data (inference/bert_evaluate.h): the
// data, masking and sample-count flags of pretrain-bert build the same samples, --split-name
// picks the split, and its first --eval-iters x --global-batch-size samples are scored in
// micro-batches of --micro-batch-size, as pretrain-bert --skip-train evaluates them; the line
// printed is that evaluation's, with the accuracies added.
//
// On a T5 checkpoint (pretrain-t5's) it scores pretrain_t5.py's loss on a split of pretrain-t5's
// span-corruption data (inference/t5_evaluate.h): the same data, masking, length
// (--encoder-seq-length, --decoder-seq-length; the checkpoint's by default) and sample-count
// flags build the same samples, and the first --eval-iters x --global-batch-size of the split are
// scored in micro-batches of --micro-batch-size, as pretrain-t5's validation scores them: the
// loss printed is the one its validation line prints for that checkpoint and those samples.
// Megatron's zero-shot tasks (LAMBADA, WIKITEXT103) build a GPT model and are refused for T5.
// Under launch the ranks are data parallel, each with the whole model, or with
// --tensor-model-parallel-size T (the checkpoint's, T ranks) the shards of one model.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/bert_data_flags.h"
#include "cli/command.h"
#include "cli/inference_flags.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/data_builder.h"
#include "inference/bert_evaluate.h"
#include "inference/checkpoint_args.h"
#include "inference/evaluate.h"
#include "inference/t5_evaluate.h"
#include "inference/t5_generation.h"
#include "model/model_settings.h"
#include "training/trainer.h"
#include "training/training_data.h"

namespace megatron::cli {
namespace {

struct EvaluateArgs {
  InferenceFlags model;
  std::string task;
  std::vector<std::string> valid_data;
  bool strict_lambada = false;
  int64_t overlapping_eval = 32;
  int64_t micro_batch_size = 1;
  int64_t batch_size = 0;  // Megatron's removed flag
  int64_t log_interval = 100;
  int64_t seed = 1234;
  CompatFlags runtime;  // --num-workers and the other runtime flags of Megatron's scripts
  // A BERT checkpoint's masked-LM evaluation: pretrain-bert's data flags.
  std::string split_name = "valid";
  data::GPTDataConfig data;
  data::BertDataConfig bert;  // the masking flags (BERT and T5)
  data::T5DataConfig t5;      // a T5 checkpoint: --encoder-seq-length, --decoder-seq-length
  int64_t global_batch_size = -1, train_iters = 0, train_samples = -1;
  int64_t eval_interval = 1000, eval_iters = 100;
};

void print_result(const std::string& line) {
  const std::string dashes(line.size() + 1, '-');
  log_print(dashes);
  log_print(line);
  log_print(dashes);
}

// The model family the checkpoint's metadata records (GPT without metadata).
model::ModelFamilyId checkpoint_family(const InferenceFlags& f) {
  const auto step = f.ckpt_step >= 0 ? std::optional<int64_t>(f.ckpt_step) : std::nullopt;
  const auto ck = inference::CheckpointArgs::read_if_present(f.options.load, step);
  return ck ? model::config_from_checkpoint_args(ck->args()).config.family_id()
            : model::ModelFamilyId::gpt;
}

// The flags of one kind of evaluation given on the command line for the other.
void refuse_flags(const CLI::App& sub, std::initializer_list<const char*> flags, const std::string& why) {
  for (const char* f : flags) MG_REQUIRE(sub.count(f) == 0, f, " ", why);
}

// A BERT or T5 checkpoint is evaluated on its training command's data.
void require_data(const EvaluateArgs& a, const char* family, const char* command) {
  MG_REQUIRE(!a.data.data_path.empty() || !a.data.train_data_path.empty() ||
                 !a.data.valid_data_path.empty() || !a.data.test_data_path.empty(),
             "evaluating a ", family, " checkpoint needs ", command, "'s data: --data-path (or "
             "--train-data-path/--valid-data-path/--test-data-path) with --split and --split-name");
}

// The split a BERT or T5 checkpoint is evaluated on, built as pretrain-bert / pretrain-t5 build
// it (the split sizes from the batch and iteration flags), and the micro-batches scored: the
// first --eval-iters x --global-batch-size samples, in micro-batches of --micro-batch-size.
struct EvalData {
  std::unique_ptr<training::TrainingData> data;
  training::DataSplit split = training::DataSplit::valid;
  int64_t size = 0;    // samples in the split
  int64_t blocks = 0;  // micro-batches scored, over all ranks
};

EvalData build_eval_data(const EvaluateArgs& a, const training::TrainingArgs& t,
                         const data::Tokenizer& tokenizer) {
  const int64_t gbs = a.global_batch_size > 0 ? a.global_batch_size : a.micro_batch_size;
  MG_REQUIRE(gbs % a.micro_batch_size == 0, "--global-batch-size ", gbs,
             " is not a multiple of --micro-batch-size ", a.micro_batch_size);
  MG_REQUIRE(a.eval_iters >= 1, "--eval-iters must be >= 1 (the number of global batches scored)");
  MG_REQUIRE(a.eval_interval >= 1, "--eval-interval must be >= 1");
  const auto world = world_communicator();
  // Rank 0 builds (and caches) the sample indices first, the others then read them.
  const auto num_samples =
      data::train_valid_test_num_samples(a.train_samples, a.train_iters, gbs, a.eval_interval, a.eval_iters);
  EvalData out;
  if (world->rank() == 0) out.data = training::build_training_data(t, tokenizer, num_samples);
  if (world->size() > 1) world->barrier();
  if (!out.data) out.data = training::build_training_data(t, tokenizer, num_samples);
  out.split = a.split_name == "train"   ? training::DataSplit::train
              : a.split_name == "valid" ? training::DataSplit::valid
                                        : training::DataSplit::test;
  out.size = out.data->size(out.split);
  MG_REQUIRE(out.size > 0, "the ", a.split_name, " split is empty (check --split or --", a.split_name,
             "-data-path)");
  out.blocks = std::min(a.eval_iters * gbs, out.size) / a.micro_batch_size;
  MG_REQUIRE(out.blocks > 0, "the ", a.split_name, " split has ", out.size, " samples, fewer than one "
             "micro-batch of --micro-batch-size ", a.micro_batch_size);
  return out;
}

// Micro-batch j of data-parallel rank `rank` of `ranks` (micro-batches rank, rank + ranks, ...),
// on `device`.
model::Batch eval_micro_batch(const EvalData& d, const EvaluateArgs& a, int rank, int ranks,
                              int64_t j, const Device& device) {
  model::Batch in = d.data->micro_batch(d.split, (rank + j * ranks) * a.micro_batch_size,
                                        a.micro_batch_size, 0, 1);
  if (!device.is_cpu())
    for (Tensor* x : {&in.tokens, &in.position_ids, &in.labels, &in.loss_mask, &in.padding_mask,
                      &in.token_types, &in.sequence_labels, &in.encoder_tokens,
                      &in.encoder_padding_mask})
      if (x->defined()) *x = x->contiguous().to(device);
  return in;
}

// This rank's share of `blocks` micro-batches dealt round-robin over `ranks`.
int64_t share_of(int64_t blocks, int rank, int ranks) {
  return blocks > rank ? (blocks - rank + ranks - 1) / ranks : 0;
}

// The masked-LM evaluation of a BERT checkpoint (see the top of the file).
void run_bert_evaluate(EvaluateArgs& a, const CLI::App& sub, const inference::InferenceModelOptions& options) {
  using namespace inference;
  refuse_flags(sub, {"--task", "--valid-data", "--strict-lambada", "--overlapping-eval"},
               "is for the zero-shot GPT tasks; --load holds a BERT checkpoint, which is evaluated "
               "on pretrain-bert's data (--data-path ... --split-name valid)");
  refuse_flags(sub, {"--encoder-seq-length", "--decoder-seq-length"},
               "is T5's; --load holds a BERT checkpoint (its length is --seq-length)");
  require_data(a, "BERT", "pretrain-bert");
  const bool binary = options.model.bert_binary_head;
  MG_REQUIRE(sub.count("--bert-binary-head") + sub.count("--bert-no-binary-head") == 0 ||
                 a.bert.binary_head == binary,
             sub.count("--bert-no-binary-head") ? "--bert-no-binary-head" : "--bert-binary-head",
             " contradicts the checkpoint, which was trained ", binary ? "with" : "without",
             " the binary head; leave the flag out");
  BertInference loaded = load_bert_model(options);
  const auto world = world_communicator();
  const bool printer = loaded.reports && loaded.data_parallel_rank == 0;
  auto print = [printer](const std::string& line) {
    if (printer) log_print(line);
  };
  training::TrainingArgs t;
  t.model = loaded.model->config();
  MG_REQUIRE(t.model.seq_length > 0, "evaluating a BERT checkpoint needs --seq-length (or "
             "--use-checkpoint-args with a checkpoint that records it)");
  t.data = a.data;
  t.seed = uint64_t(a.seed);
  t.mask_prob = a.bert.mask_prob;
  t.short_seq_prob = a.bert.short_seq_prob;
  const EvalData d = build_eval_data(a, t, *loaded.tokenizer);
  const int ranks = loaded.data_parallel_size, rank = loaded.data_parallel_rank;
  const int64_t mine = share_of(d.blocks, rank, ranks);
  print(str("> evaluating the ", a.split_name, " split: ", d.blocks, " micro-batches of ",
            a.micro_batch_size, " samples (of ", d.size, ")"));
  const Device device = loaded.model->device();
  MaskedLMTotals totals = evaluate_masked_lm(*loaded.model, mine, [&](int64_t j) {
    return eval_micro_batch(d, a, rank, ranks, j, device);
  }, [&](int64_t j) {
    if (j % a.log_interval == 0 && j > 0) print(str("> working on iteration: ", j, " | micro-batches ", j, "/", mine));
  });
  if (!loaded.reports) totals = MaskedLMTotals{};
  if (world->size() > 1) {
    const std::vector<double> v = totals.values();
    Tensor sums = Tensor::from_vector<double>(v, {int64_t(v.size())});
    world->all_reduce(sums);
    totals = MaskedLMTotals::from_values({sums.data<double>(), v.size()});
  }
  if (!printer) return;
  log_info(str("evaluate: ", totals.micro_batches, " micro-batches, ", totals.masked,
               " masked tokens, ", totals.lm_correct, " predicted",
               binary ? str(", ", totals.sop_labelled, " sentence pairs, ", totals.sop_correct, " ordered right") : ""));
  print_result(masked_lm_result_line(str("iteration ", loaded.iteration, " on ", a.split_name, " split"),
                                     totals, binary));
  log_print("done :-)");
}

// The span-corruption evaluation of a T5 checkpoint (see the top of the file).
void run_t5_evaluate(EvaluateArgs& a, const CLI::App& sub, inference::InferenceModelOptions options) {
  using namespace inference;
  refuse_flags(sub, {"--task", "--valid-data", "--strict-lambada", "--overlapping-eval"},
               "names Megatron's zero-shot tasks (tasks/zeroshot_gpt), which run a GPT model; "
               "--load holds a T5 checkpoint, which is evaluated on pretrain-t5's span-corruption "
               "data (--data-path ... --split-name valid)");
  refuse_flags(sub, {"--bert-binary-head", "--bert-no-binary-head"},
               "is BERT's; --load holds a T5 checkpoint");
  require_data(a, "T5", "pretrain-t5");
  model::TransformerConfig& cfg = options.model;
  if (a.t5.encoder_seq_length > 0) {
    MG_REQUIRE(sub.count("--seq-length") == 0 || cfg.seq_length == a.t5.encoder_seq_length,
               "--seq-length ", cfg.seq_length, " and --encoder-seq-length ",
               a.t5.encoder_seq_length, " disagree (the encoder's length; give one)");
    cfg.seq_length = int(a.t5.encoder_seq_length);
  }
  if (a.t5.decoder_seq_length > 0) {
    cfg.decoder_seq_length = int(a.t5.decoder_seq_length);
  } else if (cfg.decoder_seq_length <= 0) {  // pretrain-t5 records it with the model
    const auto step = a.model.ckpt_step >= 0 ? std::optional<int64_t>(a.model.ckpt_step) : std::nullopt;
    if (const auto ck = CheckpointArgs::read_if_present(options.load, step))
      cfg.decoder_seq_length = model::config_from_checkpoint_args(ck->args()).config.decoder_seq_length;
  }
  MG_REQUIRE(cfg.seq_length > 0 && cfg.decoder_seq_length > 0, "evaluating a T5 checkpoint needs "
             "--encoder-seq-length and --decoder-seq-length (the checkpoint's metadata has ",
             cfg.seq_length > 0 ? "no decoder length" : "no encoder length", ")");
  MG_REQUIRE(cfg.seq_length <= cfg.max_position_embeddings || !cfg.learned_position_embedding(),
             "--encoder-seq-length ", cfg.seq_length, " exceeds the model's "
             "--max-position-embeddings ", cfg.max_position_embeddings);
  T5Inference loaded = load_t5_model(options);
  const auto world = world_communicator();
  // Launched with --tensor-model-parallel-size: the ranks hold the shards of one model and run the
  // same micro-batches (the loss is whole on each); else each rank is a data-parallel replica.
  const int ranks = loaded.group ? 1 : world->size(), rank = loaded.group ? 0 : world->rank();
  const bool printer = loaded.reports && rank == 0;
  auto print = [printer](const std::string& line) {
    if (printer) log_print(line);
  };
  training::TrainingArgs t;
  t.model = loaded.model->model().config();
  t.data = a.data;
  t.seed = uint64_t(a.seed);
  t.mask_prob = a.bert.mask_prob;
  t.short_seq_prob = a.bert.short_seq_prob;
  const EvalData d = build_eval_data(a, t, *loaded.tokenizer);
  const int64_t mine = share_of(d.blocks, rank, ranks);
  print(str("> evaluating the ", a.split_name, " split: ", d.blocks, " micro-batches of ",
            a.micro_batch_size, " samples (of ", d.size, ")"));
  model::T5Model& m = loaded.model->model();
  T5LossTotals totals = evaluate_t5_loss(m, mine, [&](int64_t j) {
    return eval_micro_batch(d, a, rank, ranks, j, m.device());
  }, [&](int64_t j) {
    if (j % a.log_interval == 0 && j > 0) print(str("> working on iteration: ", j, " | micro-batches ", j, "/", mine));
  });
  if (ranks > 1) {
    Tensor sums = Tensor::from_vector<double>({totals.micro_batches, totals.loss_sum, totals.tokens}, {3});
    world->all_reduce(sums);
    const double* v = sums.data<double>();
    totals = {v[0], v[1], v[2]};
  }
  if (!printer) return;
  log_info(str("evaluate: ", int64_t(totals.micro_batches), " micro-batches, ", int64_t(totals.tokens),
               " decoder tokens in the loss, loss sum ", python_float_repr(totals.loss_sum), " nats"));
  print_result(t5_loss_result_line(str("iteration ", loaded.iteration, " on ", a.split_name, " split"), totals));
  log_print("done :-)");
}

void run_evaluate(EvaluateArgs& a, const CLI::App& sub) {
  using namespace inference;
  MG_REQUIRE(a.batch_size == 0, "--batch-size is no longer valid (Megatron-LM removed it): use "
             "--micro-batch-size");
  MG_REQUIRE(a.micro_batch_size >= 1, "--micro-batch-size must be >= 1");
  MG_REQUIRE(a.log_interval >= 1, "--log-interval must be >= 1");
  check_compat_flags(a.runtime, sub, CompatScope::Training);
  a.model.accept_bert = true;
  // pretrain-bert's data and sizing flags select a BERT checkpoint's data; on a GPT checkpoint
  // they are Megatron training flags that tasks/main.py accepts without effect.
  a.model.accept_t5 = true;
  const model::ModelFamilyId family = checkpoint_family(a.model);
  if (family != model::ModelFamilyId::bert && family != model::ModelFamilyId::t5) {
    for (const char* f : {"--data-path", "--train-data-path", "--valid-data-path", "--test-data-path",
                          "--split", "--data-cache-path", "--global-batch-size", "--train-iters",
                          "--train-samples", "--eval-interval", "--eval-iters", "--mask-prob",
                          "--short-seq-prob", "--bert-binary-head", "--bert-no-binary-head"})
      if (sub.count(f)) a.model.megatron.ignored_too.push_back(f);
    refuse_flags(sub, {"--encoder-seq-length", "--decoder-seq-length"},
                 "is T5's; --load holds a GPT checkpoint");
  }
  const InferenceModelOptions options = a.model.finish();
  if (options.model.family_id() == model::ModelFamilyId::bert) return run_bert_evaluate(a, sub, options);
  if (options.model.family_id() == model::ModelFamilyId::t5) return run_t5_evaluate(a, sub, options);
  // The data and sizing flags pretrain-bert shares with Megatron's training scripts are accepted
  // (and named as without effect) as tasks/main.py accepts them; the split name is ours alone.
  refuse_flags(sub, {"--split-name"}, "is for evaluating a BERT checkpoint on pretrain-bert's data; "
               "--load holds a GPT checkpoint, evaluated with --task LAMBADA|WIKITEXT103 --valid-data FILE");
  MG_REQUIRE(!a.task.empty(), "--task is required for a GPT checkpoint: LAMBADA or WIKITEXT103");
  MG_REQUIRE(a.task == "LAMBADA" || a.task == "WIKITEXT103", "--task ", a.task,
             " is not implemented: evaluate runs Megatron's zero-shot GPT tasks LAMBADA and "
             "WIKITEXT103");
  MG_REQUIRE(a.valid_data.size() == 1, "--valid-data takes exactly one file for ", a.task, " (got ",
             a.valid_data.size(), ")");
  const auto world = world_communicator();
  const int64_t seq_length = options.model.seq_length > 0 ? options.model.seq_length
                                                          : options.model.max_position_embeddings;
  // Several ranks: each data-parallel replica (the whole model, or T x P ranks of it under
  // tensor/pipeline parallelism) scores its share of the samples; its leader runs the loop.
  InferenceModel loaded = load_inference_model(options, world);
  const bool model_parallel = loaded.group != nullptr;
  if (!loaded.leader()) {
    loaded.follow();
    Tensor none = Tensor::zeros({4}, DType::F64);  // this rank's part of the totals
    world->all_reduce(none);
    return;
  }
  const int ranks = model_parallel ? loaded.data_parallel_size : world->size();
  const int rank = model_parallel ? loaded.data_parallel_rank : world->rank();
  auto print = [rank](const std::string& line) {
    if (rank == 0) log_print(line);
  };
  const data::Tokenizer& tok = *loaded.tokenizer;
  LanguageModel& model = *loaded.model;
  const std::string& path = a.valid_data.front();

  std::vector<ZeroShotSample> lambada;
  std::optional<LMWindows> windows;
  if (a.task == "LAMBADA") {
    print("> building lambada dataset from " + path + " ...");
    lambada = build_lambada_samples(path, tok, a.strict_lambada, seq_length);
    print(str(" > found ", lambada.size(), " samples."));
  } else {
    std::optional<Detokenizer> detok = detokenizer_for_path(path);
    if (!detok) {
      if (rank == 0)
        log_info("note: ", path, " names none of ptb, wiki, lambada (Megatron picks its detokenizer "
               "by them); using the WikiText detokenizer");
      detok = Detokenizer::Wiki;
    }
    windows.emplace(build_wikitext_windows(path, tok, seq_length, a.overlapping_eval, detok));
    print(str(" > number of original tokens: ", windows->num_original_tokens(),
              ", number of detokenized tokens: ", windows->num_tokenized_tokens()));
  }
  const int64_t count = windows ? windows->size() : int64_t(lambada.size());
  const int64_t mine = count > rank ? (count - rank + ranks - 1) / ranks : 0;  // this rank's share
  const auto start = std::chrono::steady_clock::now();
  ZeroShotOptions o;
  o.micro_batch_size = a.micro_batch_size;
  o.pad_id = tok.eod_or_throw();
  ProgressLine live(rank == 0);  // beside Megatron's lines, on a terminal
  o.progress = [&](int64_t iteration, int64_t done, int64_t total) {
    if (live.due()) live.update(progress_text(done, total, live.elapsed(), "samples"));
    if (iteration % a.log_interval != 0) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string rate;
    if (done > 0 && seconds > 0) {
      const double per_second = double(done) / seconds;
      char buf[96];
      std::snprintf(buf, sizeof buf, " | %.2f samples/s | eta %.0f s", per_second,
                    double(total - done) / per_second);
      rate = buf;
    }
    print(str("> working on iteration: ", iteration, " | samples ", done, "/", total, rate));
  };
  ZeroShotTotals t = score_samples(model, mine, [&](int64_t j) {
    const int64_t i = rank + j * ranks;
    return windows ? windows->get(i) : lambada[size_t(i)];
  }, o);
  live.finish();
  loaded.finish();
  if (world->size() > 1) {
    Tensor sums = Tensor::from_vector<double>(
        {t.loss_sum, double(t.correct), double(t.samples), double(t.scored)}, {4});
    world->all_reduce(sums);
    const double* v = sums.data<double>();
    t = {v[0], int64_t(v[1]), int64_t(v[2]), int64_t(v[3])};
  }
  if (rank != 0) return;
  log_info(str("evaluate: ", t.samples, " samples, ", t.correct, " correct, ", t.scored,
               " scored tokens, loss sum ", python_float_repr(t.loss_sum), " nats"));
  if (a.task == "LAMBADA")
    print_result(lambada_result_line(a.task, t.correct, t.samples));
  else
    print_result(wikitext_result_line(a.task, t.loss_sum, windows->num_tokenized_tokens(),
                                      windows->num_original_tokens()));
  log_print("done :-)");
}

CommandRegistrar reg("evaluate", "Zero-shot LAMBADA accuracy or WikiText-103 perplexity (Megatron's tasks/main.py); "
                     "a BERT checkpoint's masked-LM loss and accuracy, or a T5 checkpoint's span-corruption "
                     "loss, on a data split",
                     62, [](CLI::App& sub) {
  auto a = std::make_shared<EvaluateArgs>();
  a->model.add(sub);
  sub.add_option("--task", a->task, "LAMBADA (cloze accuracy) or WIKITEXT103 (perplexity); GPT checkpoints");
  sub.add_option("--valid-data", a->valid_data,
                 "The evaluation file: lambada_test.jsonl ({\"text\": ...} per line) or the raw "
                 "WikiText-103 test file (wiki.test.tokens)");
  sub.add_flag("--strict-lambada", a->strict_lambada,
               "Target the whole last word (tokenized with its leading space), not its last token");
  sub.add_option("--overlapping-eval", a->overlapping_eval,
                 "WikiText windows start every this many tokens; each scores its last this many")
      ->capture_default_str();
  sub.add_option("--micro-batch-size", a->micro_batch_size, "Samples evaluated together")
      ->capture_default_str();
  sub.add_option("--batch-size", a->batch_size, "Removed from Megatron-LM: use --micro-batch-size");
  sub.add_option("--log-interval", a->log_interval, "Progress line every this many micro-batches")
      ->capture_default_str();
  sub.add_option("--seed", a->seed, "BERT/T5: the data seed (the masked samples); GPT: accepted "
                 "(evaluation is deterministic)")->capture_default_str();
  // A BERT checkpoint: pretrain-bert's data flags (the split sizes as its training loop computes
  // them from the batch and iteration flags).
  sub.add_option("--split-name", a->split_name, "BERT/T5: the split evaluated")
      ->check(CLI::IsMember({"train", "valid", "test"}))->capture_default_str();
  add_bert_data_flags(sub, a->bert);
  add_t5_length_flags(sub, a->t5);
  add_dataset_flags(sub, a->data, "BERT/T5: ");
  sub.add_option("--global-batch-size", a->global_batch_size, "BERT/T5: samples per evaluation iteration "
                 "(default --micro-batch-size)");
  sub.add_option("--train-iters", a->train_iters, "BERT/T5: training iterations (sizes the splits)");
  sub.add_option("--train-samples", a->train_samples, "BERT/T5: training samples (sizes the splits)");
  sub.add_option("--eval-interval", a->eval_interval, "BERT/T5: evaluation interval (sizes the splits)")
      ->capture_default_str();
  sub.add_option("--eval-iters", a->eval_iters, "BERT/T5: global batches scored")->capture_default_str();
  add_compat_flags(sub, a->runtime, CompatScope::Training);
  add_megatron_flags(sub, a->model.megatron, "evaluate", CommandKind::Inference);
  sub.callback([a, &sub] { run_evaluate(*a, sub); });
});

}  // namespace
}  // namespace megatron::cli
