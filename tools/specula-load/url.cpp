#include "tools/specula-load/url.h"

#include <cctype>

#include "tools/specula/args.h"

namespace specula::load {

using cli::UsageError;

std::string Target::host_header() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + port;
}

Target parse_url(const std::string& url) {
  Target t;
  t.url = url;
  const size_t sep = url.find("://");
  if (sep == std::string::npos) throw UsageError("--url '" + url + "' is not a URL (expected ws://HOST:PORT/PATH or http://HOST:PORT/PATH)");
  std::string scheme = url.substr(0, sep);
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme == "ws") t.protocol = Protocol::WebSocket;
  else if (scheme == "http") t.protocol = Protocol::HttpSse;
  else if (scheme == "wss" || scheme == "https")
    throw UsageError("--url: " + scheme + ":// (TLS) is not supported; use ws:// or http://");
  else throw UsageError("--url: unsupported scheme '" + scheme + "' (use ws:// or http://)");

  std::string rest = url.substr(sep + 3);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  t.path = slash == std::string::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string::npos) throw UsageError("--url: user info in '" + url + "' is not supported");
  if (authority.empty()) throw UsageError("--url '" + url + "' has no host");

  std::string port;
  if (authority[0] == '[') {  // [::1]:8080
    const size_t close = authority.find(']');
    if (close == std::string::npos) throw UsageError("--url '" + url + "': unclosed '[' in the host");
    t.host = authority.substr(1, close - 1);
    std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') throw UsageError("--url '" + url + "': expected ':PORT' after the host");
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    t.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (t.host.empty()) throw UsageError("--url '" + url + "' has no host");
  if (port.empty()) port = "80";
  bool digits = port.size() <= 5;
  for (char c : port) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535)
    throw UsageError("--url '" + url + "': bad port '" + port + "'");
  t.port = port;
  if (t.path.empty()) t.path = t.protocol == Protocol::WebSocket ? "/v1/ws" : "/v1/chat/completions";
  return t;
}

}  // namespace specula::load
