// `specula serve`'s server: one port for the chat page, the WebSocket protocol, the
// OpenAI-compatible routes, /health and /metrics (docs/protocol.md, docs/serving.md).
#pragma once
#include <functional>
#include <string>

#include "actors/engine.h"
#include "net/server_state.h"

namespace specula::net {

// Listens on config.host:config.port and serves until SIGINT or SIGTERM, then drains: stops
// accepting, lets running requests finish for up to config.shutdown_timeout, cancels the rest,
// closes the connections and returns 0. Throws std::runtime_error when it cannot listen.
// `on_listening` gets the URL once the port is open (the real port when config.port is 0).
int run_server(actors::Engine& engine, const ServerConfig& config,
               const std::function<void(const std::string& url)>& on_listening = {});

}  // namespace specula::net
