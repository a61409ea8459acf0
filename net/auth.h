// Access control of `specula serve` (docs/serving.md, "API keys and origins"): an API key required
// as `Authorization: Bearer KEY` on the API routes and the WebSocket upgrade (a browser, which
// cannot set that header on a WebSocket, offers it as the subprotocol "specula.key.<base64url of
// the key>" next to "specula"), compared in constant time; and the WebSocket upgrade's Origin
// checked against the served host (cross-site WebSocket hijacking). /health and the chat page
// stay open.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/http_util.h"

namespace specula::net {

struct AccessConfig {
  std::string api_key;                       // "" = no key required
  std::vector<std::string> allowed_origins;  // besides the served host; "*" = any
};

// The refusal for a request, or nothing when it may go on. `websocket`: the request is an upgrade
// on /v1/ws (the key may come as a subprotocol; the Origin is checked).
std::optional<ApiError> check_access(const AccessConfig& access, const HttpRequest& req, bool websocket);

// Whether `path` needs the key when one is set: the API, the token routes and /metrics; not /health
// or the page.
bool needs_key(std::string_view path);

// The subprotocol a WebSocket upgrade's response names: "specula" when the client offered it
// (a browser that offers subprotocols drops a connection whose response names none), else "".
std::string websocket_subprotocol(const HttpRequest& req);

}  // namespace specula::net
