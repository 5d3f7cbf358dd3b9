// `megatron serve`: the text generation server (Megatron's tools/run_text_generation_server.py)
// for a checkpoint: PUT /api, POST /v1/completions, GET /health. Binds 127.0.0.1 by default;
// any other host needs --api-key. SIGINT/SIGTERM stop it cleanly. Under launch/mpirun with
// tensor or pipeline parallelism rank 0 serves and every rank runs its shard of each forward.
// A T5 checkpoint (pretrain-t5's): PUT /api fills the <extra_id_N> spans of its prompts
// (inference/server_api.h), on one process or on the checkpoint's tensor-parallel ranks (rank 0
// serves, the others run their shard of each forward: inference/t5_leader.h).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <thread>

#include "cli/command.h"
#include "cli/inference_flags.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "inference/server.h"
#include "inference/t5_generation.h"
#include "inference/t5_leader.h"

namespace megatron::cli {
namespace {

int g_stop_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  const char c = char(sig);
  [[maybe_unused]] auto w = ::write(g_stop_pipe[1], &c, 1);
}

struct ServeArgs {
  InferenceFlags model;
  inference::ServerOptions server;
  // Flags of Megatron's run_text_generation_server.py. The server there samples with each
  // request's own fields, so the sampling flags only set what a script passes; so here.
  int64_t seed = 1234;          // --seed: the sampling seeds of requests without their own
  int micro_batch_size = 1;     // --micro-batch-size
  int64_t out_seq_length = 1024, tokens_to_generate = 30;
  double temperature = 1.0, top_p = 0.0;
  int top_k = 1;
  bool return_log_probs = false;
};

void serve_model(ServeArgs& a, inference::LanguageModel& model, const data::Tokenizer& tokenizer,
                 const std::function<int()>& finish_ranks = {});

// A T5 checkpoint: on one process, or launched on its --tensor-model-parallel-size ranks.
void serve_t5(ServeArgs& a, const inference::InferenceModelOptions& options) {
  const int world = world_communicator()->size();
  MG_REQUIRE(world == 1 || options.tensor_model_parallel_size > 1,
             "serving a T5 checkpoint on ", world, " launched ranks needs "
             "--tensor-model-parallel-size ", world, " (a checkpoint saved with that size, or "
             "converted to it by `megatron checkpoint convert`): serve runs one model, and T5 "
             "splits it over tensor-parallel ranks only; or run `megatron serve` on one process "
             "(a sharded checkpoint's shards are merged in memory)");
  inference::T5Inference t5 = inference::load_t5_model(options);
  if (!t5.group) return serve_model(a, *t5.model, *t5.tokenizer);
  if (!t5.reports) {
    // A follower runs its shard of each forward until rank 0 stops the server and ends it.
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
    inference::follow_leader(*t5.model, *t5.group);
    return;
  }
  inference::T5LeaderEngine leader(std::move(t5.model), t5.group);
  serve_model(a, leader, *t5.tokenizer, [&leader] {
    leader.finish();
    return leader.group_size();
  });
}

void run_serve(ServeArgs& a) {
  if (a.server.api_key.empty())
    if (const char* env = std::getenv("MEGATRON_API_KEY")) a.server.api_key = env;
  // Check the network options before the (slow) model load.
  MG_REQUIRE(inference::is_loopback_host(a.server.host) || !a.server.api_key.empty(), "--host ",
             a.server.host, " would expose the server beyond this machine without "
             "authentication; pass --api-key KEY (or set MEGATRON_API_KEY) or bind 127.0.0.1");
  MG_REQUIRE(a.seed > 0, "--seed ", a.seed, " must be a positive integer (Megatron's rule)");
  a.server.seed = uint64_t(a.seed);
  a.model.accept_t5 = true;
  const inference::InferenceModelOptions options = a.model.finish();
  if (options.model.family_id() == model::ModelFamilyId::t5) return serve_t5(a, options);
  auto loaded = inference::load_inference_model(options);
  if (!loaded.leader()) {
    // A follower runs its part of each forward until rank 0 stops the server. The launcher
    // forwards SIGINT/SIGTERM to every rank: rank 0 stops the server and then ends the others.
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
    loaded.follow();
    return;
  }
  MG_REQUIRE(loaded.data_parallel_size == 1, "serve runs one model: launch --tensor-model-"
             "parallel-size x --pipeline-model-parallel-size ranks (", loaded.group->size(),
             "), not ", loaded.group->size() * loaded.data_parallel_size);
  std::function<int()> finish_ranks;
  if (loaded.group)
    finish_ranks = [&loaded] {
      loaded.finish();
      return loaded.group->size();
    };
  serve_model(a, *loaded.model, *loaded.tokenizer, finish_ranks);
}

// Serves `model` until a signal or the server stops; then `finish_ranks` (empty on one process)
// ends the followers and gives the number of ranks.
void serve_model(ServeArgs& a, inference::LanguageModel& model, const data::Tokenizer& tokenizer,
                 const std::function<int()>& finish_ranks) {

  // SIGINT/SIGTERM may land on any thread (BLAS and OpenMP threads exist before main): the
  // handler only writes to a pipe, and a waiter thread turns that into server.stop().
  MG_REQUIRE(::pipe(g_stop_pipe) == 0, "cannot create a pipe for signal handling");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  inference::TextGenerationServer server(model, tokenizer, a.server);
  const int port = server.bind();
  log_print(str("serving on http://", a.server.host, ":", port,
                " (PUT /api, POST /v1/completions, GET /health)"));
  std::fflush(stdout);
  std::thread waiter([&server] {
    char sig = 0;
    while (::read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) log_info("signal ", int(sig), ": stopping the server");
    server.stop();
  });
  server.serve();
  // serve() returned: wake the waiter if the server stopped for another reason.
  const char none = 0;
  [[maybe_unused]] auto w = ::write(g_stop_pipe[1], &none, 1);
  waiter.join();
  if (finish_ranks) log_info("stopped: all ", finish_ranks(), " ranks have finished");
}

CommandRegistrar reg("serve", "Text generation server (Megatron PUT /api, OpenAI /v1/completions)",
                     61, [](CLI::App& sub) {
  auto a = std::make_shared<ServeArgs>();
  a->model.add(sub);
  auto& s = a->server;
  sub.add_option("--host", s.host, "Address to bind (non-loopback needs --api-key)")->capture_default_str();
  sub.add_option("--port", s.port, "Port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  sub.add_option("--api-key", s.api_key,
                 "Require 'Authorization: Bearer KEY' on every request (or MEGATRON_API_KEY)");
  sub.add_option("--max-batch-size,--inference-max-batch-size", s.max_batch_size,
                 "Sequences decoded together")->capture_default_str()->check(CLI::Range(1, 4096));
  sub.add_option("--batch-window-ms", s.batch_window_ms,
                 "When a request reaches an idle server, wait this long for others before the first step")->capture_default_str()->check(CLI::Range(0.0, 1000.0));
  sub.add_option("--max-queue-size,--inference-max-requests", s.max_queue_size,
                 "Requests waiting before 503")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub.add_option("--max-request-bytes", s.max_request_bytes, "Largest request body (413 beyond)")
      ->capture_default_str()->check(CLI::Range(64, 1 << 30));
  sub.add_option("--max-tokens-to-generate", s.max_tokens_to_generate, "Largest tokens_to_generate / max_tokens")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  sub.add_option("--seed", a->seed, "Seed of the sampling of requests without their own random_seed (/api) or seed "
                 "(/v1/completions): each takes the next seed of the sequence it starts (> 0)")
      ->capture_default_str();
  sub.add_option("--micro-batch-size", a->micro_batch_size,
                 "Accepted (Megatron's); --max-batch-size sets the sequences decoded together")
      ->check(CLI::PositiveNumber)->capture_default_str();
  const std::string per_request = " (Megatron's server flag; each request sets its own)";
  sub.add_option("--out-seq-length", a->out_seq_length, "Longest output" + per_request);
  sub.add_option("--num-tokens-to-generate", a->tokens_to_generate, "Tokens to generate" + per_request);
  sub.add_option("--temperature", a->temperature, "Sampling temperature" + per_request);
  sub.add_option("--top_k,--top-k", a->top_k, "Top-k sampling" + per_request);
  sub.add_option("--top_p,--top-p", a->top_p, "Nucleus sampling" + per_request);
  sub.add_flag("--return-log-probs", a->return_log_probs, "Log-probs" + per_request);
  add_megatron_flags(sub, a->model.megatron, "serve", CommandKind::Inference);
  sub.callback([a] { run_serve(*a); });
});

}  // namespace
}  // namespace megatron::cli
