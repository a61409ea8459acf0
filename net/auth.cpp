#include "net/auth.h"

#include <algorithm>
#include <array>
#include <cctype>

#include <openssl/crypto.h>
#include <openssl/sha.h>

namespace specula::net {

namespace http = boost::beast::http;

namespace {

constexpr std::string_view kKeyProtocol = "specula.key.";
constexpr char kBase64Url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::array<unsigned char, SHA256_DIGEST_LENGTH> digest(std::string_view s) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> d{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

// Equal in time that depends on neither value: both are hashed to 32 bytes first (so the length
// of the key does not show either), then compared with OpenSSL's constant-time compare.
bool same_key(std::string_view given, std::string_view key) {
  const auto a = digest(given), b = digest(key);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<std::string> base64url_decode(std::string_view s) {
  std::string out;
  unsigned buf = 0;
  int bits = 0;
  for (char c : s) {
    const char* p = std::find(kBase64Url, kBase64Url + 64, c);
    if (p == kBase64Url + 64) return std::nullopt;
    buf = (buf << 6) | static_cast<unsigned>(p - kBase64Url);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buf >> bits) & 0xff));
    }
  }
  return out;
}

// The comma-separated items of a header.
std::vector<std::string_view> items(std::string_view v) {
  std::vector<std::string_view> out;
  while (!v.empty()) {
    const size_t comma = v.find(',');
    out.push_back(trim(v.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return out;
}

// The key a request presents: the Authorization header's bearer token, or (WebSocket only) the
// key subprotocol.
std::optional<std::string> presented_key(const HttpRequest& req, bool websocket) {
  if (auto it = req.find(http::field::authorization); it != req.end()) {
    const std::string_view v = trim(std::string_view(it->value().data(), it->value().size()));
    if (v.size() > 7 && lower(v.substr(0, 7)) == "bearer ") return std::string(trim(v.substr(7)));
    return std::string();  // another scheme: presented, and wrong
  }
  if (websocket)
    if (auto it = req.find(http::field::sec_websocket_protocol); it != req.end())
      for (std::string_view p : items(std::string_view(it->value().data(), it->value().size())))
        if (p.starts_with(kKeyProtocol)) return base64url_decode(p.substr(kKeyProtocol.size())).value_or(std::string());
  return std::nullopt;
}

// "scheme://host[:port]" -> "host:port" in lower case, the scheme's port when none is written.
std::optional<std::string> origin_authority(std::string_view origin) {
  const size_t sep = origin.find("://");
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string scheme = lower(origin.substr(0, sep));
  std::string_view rest = origin.substr(sep + 3);
  if (rest.empty() || rest.find('/') != std::string_view::npos) return std::nullopt;
  std::string auth = lower(rest);
  const size_t bracket = auth.rfind(']');
  const size_t colon = auth.rfind(':');
  if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket))
    auth += scheme == "https" || scheme == "wss" ? ":443" : ":80";
  return auth;
}

// The Host header as "host:port" (port 80 when none is written: the server speaks plain HTTP).
std::string host_authority(std::string_view host) {
  std::string h = lower(trim(host));
  const size_t bracket = h.rfind(']');
  const size_t colon = h.rfind(':');
  if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket)) h += ":80";
  return h;
}

// The request's Origin header, if it has one.
std::optional<std::string_view> origin_of(const HttpRequest& req) {
  const auto it = req.find(http::field::origin);
  if (it == req.end()) return std::nullopt;
  return std::string_view(it->value().data(), it->value().size());
}

// --allowed-origins lists the origin exactly, or holds "*".
bool listed(const AccessConfig& access, std::string_view origin) {
  const auto& list = access.allowed_origins;
  return std::find(list.begin(), list.end(), "*") != list.end() || std::find(list.begin(), list.end(), origin) != list.end();
}

}  // namespace

std::string key_owner(const AccessConfig& access, const HttpRequest& req) {
  if (access.api_keys.empty()) return "";
  const auto d = digest(presented_key(req, false).value_or(std::string()));
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

bool needs_key(std::string_view path) {
  return path.starts_with("/v1/") || path == "/metrics" || path == "/tokenize" || path == "/detokenize";
}

std::string websocket_subprotocol(const HttpRequest& req) {
  if (auto it = req.find(http::field::sec_websocket_protocol); it != req.end())
    for (std::string_view p : items(std::string_view(it->value().data(), it->value().size())))
      if (p == "specula") return "specula";
  return "";
}

CorsAnswer cors_answer(const AccessConfig& access, const HttpRequest& req) {
  const std::optional<std::string_view> origin = origin_of(req);
  return {origin && listed(access, *origin) ? std::string(*origin) : std::string(), !access.allowed_origins.empty()};
}

void apply_cors(http::fields& res, const CorsAnswer& cors) {
  if (!cors.allow_origin.empty()) res.set(http::field::access_control_allow_origin, cors.allow_origin);
  if (cors.vary || !cors.allow_origin.empty()) res.set(http::field::vary, "Origin");
}

HttpResponse preflight_response(const AccessConfig& access, const HttpRequest& req) {
  const std::optional<std::string_view> origin = origin_of(req);
  if (origin && !listed(access, *origin)) {
    return error_response(ApiError("forbidden_origin", "requests from origin '" + std::string(*origin) +
                                                           "' are not allowed: list it with --allowed-origins"),
                          req.keep_alive(), req.version());
  }
  HttpResponse res = make_response(204, "", "text/plain", req.keep_alive(), req.version());
  res.erase(http::field::content_type);
  res.set(http::field::allow, "GET, HEAD, POST, DELETE, OPTIONS");
  if (origin) {
    res.set(http::field::access_control_allow_methods, "GET, HEAD, POST, DELETE, OPTIONS");
    const auto asked = req.find(http::field::access_control_request_headers);
    res.set(http::field::access_control_allow_headers,
            asked != req.end() ? std::string(asked->value()) : std::string("Authorization, Content-Type"));
    res.set(http::field::access_control_max_age, "600");
  }
  return res;
}

std::optional<ApiError> check_access(const AccessConfig& access, const HttpRequest& req, bool websocket) {
  if (const std::optional<std::string_view> o = origin_of(req)) {
    const std::string_view origin = *o;
    const std::optional<std::string> from = origin_authority(origin);
    const auto host = req.find(http::field::host);
    const bool same = from && host != req.end() &&
                      *from == host_authority(std::string_view(host->value().data(), host->value().size()));
    if (!listed(access, origin) && !same)
      return ApiError("forbidden_origin", std::string(websocket ? "a WebSocket" : "a request") + " from origin '" +
                                              std::string(origin) +
                                              "' is not allowed: the page must be served by this server, or the "
                                              "origin listed with --allowed-origins");
  }
  if (access.api_keys.empty()) return std::nullopt;
  const std::optional<std::string> key = presented_key(req, websocket);
  if (!key)
    return ApiError("missing_api_key", websocket ? "this server requires an API key: send 'Authorization: Bearer KEY' "
                                                   "(or the subprotocol specula.key.<base64url of KEY>)"
                                                 : "this server requires an API key: send 'Authorization: Bearer KEY'");
  bool valid = false;  // every key compared, so the time does not say which one matched
  for (const std::string& k : access.api_keys) valid = same_key(*key, k) || valid;
  if (!valid) return ApiError("invalid_api_key", "the API key is not valid");
  return std::nullopt;
}

}  // namespace specula::net
