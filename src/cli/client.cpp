// `megatron client HOST:PORT`: Megatron's tools/text_generation_cli.py. Loops: asks for a prompt
// and a number of tokens, sends PUT /api, prints "Megatron Response:" and the text (or
// "Error <status>: <message>"). Ends cleanly at end of input; a bad number or an unreachable
// server is reported and the loop goes on.
#include <httplib.h>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "core/error.h"

namespace megatron::cli {
namespace {

struct ClientArgs {
  std::string address;
  std::string api_key;
  int timeout = 600;
};

// "HOST:PORT" (IPv4 or name; "[v6]:PORT" for IPv6).
std::pair<std::string, int> split_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  MG_REQUIRE(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
             "the server address must be HOST:PORT (e.g. localhost:5000), got '", address, "'");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  const std::string p = address.substr(colon + 1);
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  MG_REQUIRE(ec == std::errc() && end == p.data() + p.size() && port > 0 && port <= 65535,
             "the port in '", address, "' must be a number in [1, 65535]");
  return {host, port};
}

bool read_line(const char* prompt, std::string& line) {
  std::printf("%s", prompt);
  std::fflush(stdout);
  if (!std::getline(std::cin, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

void run_client(const ClientArgs& args) {
  const auto [host, port] = split_address(args.address);
  httplib::Client client(host, port);
  client.set_read_timeout(args.timeout, 0);
  client.set_write_timeout(args.timeout, 0);
  if (!args.api_key.empty()) client.set_bearer_token_auth(args.api_key);
  std::string prompt, count;
  while (read_line("Enter prompt: ", prompt)) {
    if (!read_line("Enter number of tokens to generate: ", count)) break;
    int64_t tokens = 0;
    const char* b = count.data();
    while (*b == ' ') ++b;
    const char* e = count.data() + count.size();
    while (e > b && e[-1] == ' ') --e;
    auto [end, ec] = std::from_chars(b, e, tokens);
    if (ec != std::errc() || end != e) {
      std::printf("Error: '%s' is not a whole number of tokens\n", count.c_str());
      continue;
    }
    const nlohmann::json body = {{"prompts", {prompt}}, {"tokens_to_generate", tokens}};
    auto res = client.Put("/api", body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                          "application/json");
    if (!res) {
      std::printf("Error: no response from %s (%s)\n", args.address.c_str(),
                  httplib::to_string(res.error()).c_str());
      continue;
    }
    nlohmann::json reply = nlohmann::json::parse(res->body, nullptr, false);
    if (res->status != 200) {
      std::string message = res->body;
      if (reply.is_object() && reply.contains("error") && reply["error"].is_string())
        message = reply["error"].get<std::string>();
      else if (reply.is_object() && reply.contains("message") && reply["message"].is_string())
        message = reply["message"].get<std::string>();
      std::printf("Error %d: %s\n", res->status, message.c_str());
      continue;
    }
    if (!reply.is_object() || !reply.contains("text") || !reply["text"].is_array() ||
        reply["text"].empty() || !reply["text"][0].is_string()) {
      std::printf("Error: the server's reply has no text: %s\n", res->body.substr(0, 200).c_str());
      continue;
    }
    std::printf("Megatron Response: \n%s\n", reply["text"][0].get<std::string>().c_str());
  }
  std::printf("\n");
}

CommandRegistrar reg("client", "Interactive client for a running `megatron serve` (PUT /api)", 62,
                     [](CLI::App& sub) {
                       auto args = std::make_shared<ClientArgs>();
                       sub.add_option("address", args->address, "Server as HOST:PORT")->required();
                       sub.add_option("--api-key", args->api_key,
                                      "Bearer token when the server was started with --api-key");
                       sub.add_option("--timeout", args->timeout, "Seconds to wait for a reply")
                           ->capture_default_str()
                           ->check(CLI::Range(1, 86400));
                       sub.callback([args] { run_client(*args); });
                     });

}  // namespace
}  // namespace megatron::cli
