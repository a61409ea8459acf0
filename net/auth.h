// Access control of `specula serve` (docs/serving.md, "API keys and origins"): an API key required
// as `Authorization: Bearer KEY` on the API routes and the WebSocket upgrade (a browser, which
// cannot set that header on a WebSocket, offers it as the subprotocol "specula.key.<base64url of
// the key>" next to "specula"), compared in constant time; and the Origin of the WebSocket upgrade
// and of every API request checked against the served host and --allowed-origins (cross-site
// WebSocket hijacking; a page of another site posting to a server without a key). /health and the
// chat page stay open.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/http_util.h"

namespace specula::net {

struct AccessConfig {
  std::vector<std::string> api_keys;         // none = no key required; any one of them opens the API
  std::vector<std::string> allowed_origins;  // besides the served host; "*" = any
};

// The refusal for a request, or nothing when it may go on: an Origin that is neither this server
// nor listed (forbidden_origin), then the key. `websocket`: the request is an upgrade on /v1/ws
// (the key may come as a subprotocol).
std::optional<ApiError> check_access(const AccessConfig& access, const HttpRequest& req, bool websocket);

// Whose a kept thing is (a response of the Responses API): on a server that requires keys, the
// SHA-256 of the key the request presents (after check_access let it in); "" on a server without
// keys, where every client is the same owner. Keys read again on SIGHUP keep their owners.
std::string key_owner(const AccessConfig& access, const HttpRequest& req);

// CORS for the HTTP routes, what a response to a request carries.
struct CorsAnswer {
  // Access-Control-Allow-Origin: the request's Origin when --allowed-origins lists it (or with
  // "*" there, any Origin); "" otherwise (no Origin, the served host's own, or one not listed), and
  // the browser keeps the response from the page.
  std::string allow_origin;
  // Vary: Origin, on every answer of a server that lists origins (granted or not), so that a cache
  // between the server and the browsers keeps one copy an Origin.
  bool vary = false;
};
CorsAnswer cors_answer(const AccessConfig& access, const HttpRequest& req);

// Sets the headers of `cors` on a response.
void apply_cors(boost::beast::http::fields& res, const CorsAnswer& cors);

// The answer to OPTIONS (a browser's CORS preflight before a request with an Authorization or
// JSON Content-Type header): 204 granting the listed origin GET and POST with the headers it
// asks for, for ten minutes; 403 forbidden_origin for an Origin not listed; 204 with Allow
// for a client that sends none. Access-Control-Allow-Origin and Vary are the caller's to set
// (apply_cors with cors_answer), as on every other answer.
HttpResponse preflight_response(const AccessConfig& access, const HttpRequest& req);

// Whether `path` needs the key when one is set: the API, the token routes and /metrics; not /health
// or the page.
bool needs_key(std::string_view path);

// The subprotocol a WebSocket upgrade's response names: "specula" when the client offered it
// (a browser that offers subprotocols drops a connection whose response names none), else "".
std::string websocket_subprotocol(const HttpRequest& req);

}  // namespace specula::net
