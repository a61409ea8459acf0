// Using Specula's engine from C++ (include/specula/specula.h): stream one chat reply with the
// coroutine API on your own executor, then run a second request with the blocking wrapper.
//
//   engine_example MODEL.gguf [DRAFTER] [PROMPT]     (DRAFTER: ngram (default), skip:4-7, eagle, none, a model path)
//   SPECULA_PIPELINE=1 engine_example MODEL.gguf skip:4-7
//
// Built in the tree, and out of it against the installed package by tests/package/ (a
// CMakeLists.txt of four lines: find_package(Specula), add_executable, target_link_libraries).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "specula/specula.h"

boost::asio::awaitable<void> chat(specula::Engine& engine, std::string prompt) {
  // Build the request in a named variable: GCC 12 destroys a temporary aggregate inside a
  // co_await expression twice (a compiler bug), so `co_await engine.generate(Request{...})` crashes.
  specula::Request request;
  request.prompt = std::move(prompt);
  request.chat = true;
  request.max_tokens = 64;
  request.top_logprobs = 0;  // each token's log-probability, no alternatives
  specula::Stream stream = co_await engine.generate(std::move(request));
  double logprob = 0;
  int scored = 0;
  for (;;) {
    specula::Event ev = co_await stream.next();
    std::cout << ev.text << std::flush;  // a token's text, or what the detokenizer held back at the end
    if (ev.logprob) logprob += *ev.logprob, ++scored;
    if (ev.kind == specula::Event::Kind::Error) std::cerr << "\nerror: " << ev.error << "\n";
    if (ev.kind == specula::Event::Kind::Done)
      std::cout << "\n[" << ev.finish_reason << ": " << ev.stats.generated << " tokens in " << ev.stats.rounds
                << " rounds, " << ev.stats.accepted << " of " << ev.stats.drafted << " drafts accepted; mean log-probability "
                << (scored ? logprob / scored : 0.0) << "]\n";
    if (ev.terminal()) break;
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: engine_example MODEL [DRAFTER] [PROMPT]\n");
    return 2;
  }
  try {
    specula::EngineOptions options;
    options.model = argv[1];
    options.drafter = argc > 2 ? argv[2] : "ngram";
    if (const char* p = std::getenv("SPECULA_PIPELINE")) options.pipeline = std::string(p) == "1";
    specula::Engine engine(options);
    const std::string prompt = argc > 3 ? argv[3] : "Write a haiku about the sea.";

    boost::asio::io_context io;  // the caller's own executor; the engine runs its actors on its own threads
    auto done = boost::asio::co_spawn(io, chat(engine, prompt), boost::asio::use_future);
    io.run();
    done.get();

    specula::Request plain;
    plain.prompt = "The capital of France is";
    plain.max_tokens = 16;
    specula::Result r = engine.generate_blocking(plain);
    std::cout << "blocking: " << r.text << " [" << r.finish_reason << "]\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_example: %s\n", e.what());
    return 1;
  }
}
