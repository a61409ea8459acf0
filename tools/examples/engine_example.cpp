// Using Specula's engine from C++: stream one chat reply with the coroutine API, then run a
// second request with the blocking wrapper.
//
//   engine_example MODEL.gguf [DRAFTER] [PROMPT]     (DRAFTER: ngram (default), skip:4-7, none, a model path)
//   SPECULA_TRACE=trace.json SPECULA_PIPELINE=1 engine_example MODEL.gguf skip:4-7
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "actors/engine.h"

using specula::actors::Engine;
using specula::actors::EngineConfig;
using specula::actors::EngineRequest;
using specula::actors::StreamEvent;

boost::asio::awaitable<void> chat(Engine& engine, std::string prompt) {
  // Build the request in a named variable: GCC 12 destroys a temporary aggregate inside a
  // co_await expression twice (a compiler bug), so `co_await engine.generate(EngineRequest{...})` crashes.
  EngineRequest request;
  request.prompt = std::move(prompt);
  request.chat = true;
  request.max_tokens = 64;
  auto stream = co_await engine.generate(std::move(request));
  for (;;) {
    StreamEvent ev = co_await stream.next();
    std::cout << ev.text << std::flush;  // a token's text, or what the detokenizer held back at the end
    if (ev.kind == StreamEvent::Kind::Error) std::cerr << "\nerror: " << ev.error << "\n";
    if (ev.kind == StreamEvent::Kind::Done)
      std::cout << "\n[" << ev.finish_reason << ": " << ev.stats.generated << " tokens in " << ev.stats.rounds
                << " rounds, " << ev.stats.accepted << " of " << ev.stats.drafted << " drafts accepted]\n";
    if (ev.terminal()) break;
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: engine_example MODEL [DRAFTER] [PROMPT]\n");
    return 2;
  }
  try {
    EngineConfig config;
    config.target = argv[1];
    config.drafter = argc > 2 ? argv[2] : "ngram";
    // SPECULA_TRACE=FILE writes a Chrome trace (open it in ui.perfetto.dev); SPECULA_PIPELINE=1 pipelines.
    if (const char* t = std::getenv("SPECULA_TRACE")) config.trace_path = t;
    if (const char* p = std::getenv("SPECULA_PIPELINE")) config.pipeline = std::string(p) == "1";
    Engine engine(config);
    const std::string prompt = argc > 3 ? argv[3] : "Write a haiku about the sea.";

    boost::asio::io_context io;  // the caller's own executor; the engine runs its actors on its own threads
    auto done = boost::asio::co_spawn(io, chat(engine, prompt), boost::asio::use_future);
    io.run();
    done.get();

    EngineRequest plain;
    plain.prompt = "The capital of France is";
    plain.max_tokens = 16;
    specula::actors::GenerateResult r = engine.generate_blocking(plain);
    std::cout << "blocking: " << r.text << " [" << r.finish_reason << "]\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_example: %s\n", e.what());
    return 1;
  }
}
