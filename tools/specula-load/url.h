// The target URL: ws:// for the WebSocket protocol, http:// for OpenAI-compatible SSE.
#pragma once
#include <string>

namespace specula::load {

enum class Protocol { WebSocket, HttpSse };

struct Target {
  Protocol protocol = Protocol::WebSocket;
  std::string url;   // as given
  std::string host;  // "127.0.0.1", "localhost", "::1" (no brackets)
  std::string port;  // "8080"; defaults to 80
  std::string path;  // "/v1/ws"; defaults to "/v1/ws" (ws) or "/v1/chat/completions" (http)
  // "host:port" (brackets around IPv6) for the Host header.
  std::string host_header() const;
};

// Throws cli::UsageError naming what is wrong ("unsupported scheme 'ftp'", "bad port '99999'").
// wss:// and https:// are refused: the tool speaks plain TCP to a local server.
Target parse_url(const std::string& url);

}  // namespace specula::load
