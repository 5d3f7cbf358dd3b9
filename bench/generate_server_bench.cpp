// Load test of the text generation server: an in-process server with a small random GPT on a
// loopback port, C clients each sending R requests (PUT /api, 16-token prompt, 16 tokens
// greedy) back to back. Prints requests/s, generated tokens/s and latency p50/p90/p99.
// With --long-clients L, the first L clients ask for --long-tokens tokens instead (a mixed load:
// short requests behind long ones), and latencies are also printed per class.
//   build/bench/generate_server_bench [--clients 16 --requests 8 --layers 4 --hidden 256
//                                      --heads 4 --tokens 16 --max-batch 16 --window-us 0
//                                      --long-clients 0 --long-tokens 128]
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"
#include "data/tokenizer.h"
#include "generate_common.h"
#include "inference/server.h"

using namespace megatron;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  megatron::tune_host_allocator();
  const bench::Flags f(argc, argv);
  const int64_t clients = f.get("--clients", 16), requests = f.get("--requests", 8),
                layers = f.get("--layers", 4), hidden = f.get("--hidden", 256),
                heads = f.get("--heads", 4), tokens = f.get("--tokens", 16),
                max_batch = f.get("--max-batch", 16), window_us = f.get("--window-us", 0),
                long_clients = f.get("--long-clients", 0), long_tokens = f.get("--long-tokens", 128);
  set_log_level(LogLevel::Warn);
  data::NullTokenizer tokenizer(50257);
  const auto cfg = bench::bench_config(layers, hidden, heads, 50304, 256);
  inference::GPTEngine model(cfg, bench::random_weights(cfg));
  inference::ServerOptions options;
  options.port = 0;
  options.max_batch_size = int(max_batch);
  options.batch_window_ms = double(window_us) / 1000.0;
  options.max_queue_size = size_t(clients) * 2;
  inference::TextGenerationServer server(model, tokenizer, options);
  const int port = server.bind();
  std::thread serving([&] { server.serve(); });

  std::mutex mutex;
  std::vector<double> latencies, short_latencies, long_latencies;
  int64_t failures = 0, generated = 0;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(600, 0);
      const bool is_long = c < long_clients;
      const int64_t n = is_long ? long_tokens : tokens;
      for (int64_t r = 0; r < requests; ++r) {
        std::string prompt;
        for (int i = 0; i < 16; ++i) prompt += std::to_string((c * 131 + r * 17 + i * 7) % 50000) + " ";
        const std::string body = "{\"prompts\": [\"" + prompt + "\"], \"tokens_to_generate\": " +
                                 std::to_string(n) + ", \"top_k\": 1, \"no_log\": true}";
        const auto t0 = Clock::now();
        auto res = cli.Put("/api", body, "application/json");
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::lock_guard lock(mutex);
        if (!res || res->status != 200) {
          ++failures;
        } else {
          latencies.push_back(ms);
          (is_long ? long_latencies : short_latencies).push_back(ms);
          generated += n;
        }
      }
    });
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  server.stop();
  serving.join();

  for (auto* v : {&latencies, &short_latencies, &long_latencies}) std::sort(v->begin(), v->end());
  auto pct_of = [](const std::vector<double>& v, double p) {
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, size_t(p * double(v.size())))];
  };
  auto pct = [&](double p) { return pct_of(latencies, p); };
  std::printf("model: %lld layers, hidden %lld, heads %lld, vocab 50304; %lld clients x %lld requests, "
              "16-token prompts, %lld tokens greedy, max batch %lld, batch window %lld us\n",
              (long long)layers, (long long)hidden, (long long)heads, (long long)clients,
              (long long)requests, (long long)tokens, (long long)max_batch, (long long)window_us);
  std::printf("| requests | failed | requests/s | generated tokens/s | p50 ms | p90 ms | p99 ms |\n"
              "|---|---|---|---|---|---|---|\n");
  std::printf("| %zu | %lld | %.2f | %.1f | %.1f | %.1f | %.1f |\n", latencies.size(),
              (long long)failures, double(latencies.size()) / seconds,
              double(generated) / seconds, pct(0.5), pct(0.9), pct(0.99));
  if (long_clients > 0) {
    std::printf("%lld of the clients ask for %lld tokens each time\n| class | requests | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|---|\n",
                (long long)long_clients, (long long)long_tokens);
    for (auto [name, v] : {std::pair{"short", &short_latencies}, std::pair{"long", &long_latencies}})
      std::printf("| %s | %zu | %.1f | %.1f | %.1f |\n", name, v->size(), pct_of(*v, 0.5),
                  pct_of(*v, 0.9), pct_of(*v, 0.99));
  }
  return failures == 0 ? 0 : 1;
}
