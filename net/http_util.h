// HTTP helpers the routes share: JSON responses and OpenAI's error shape.
#pragma once
#include <string>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "net/api_request.h"

namespace specula::net {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpResponse = boost::beast::http::response<boost::beast::http::string_body>;

inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline HttpResponse make_response(unsigned status, std::string body, const char* content_type, bool keep_alive,
                                  unsigned version = 11) {
  HttpResponse res{static_cast<boost::beast::http::status>(status), version};
  res.set(boost::beast::http::field::server, "specula");
  res.set(boost::beast::http::field::content_type, content_type);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

inline HttpResponse json_response(unsigned status, const nlohmann::json& body, bool keep_alive, unsigned version = 11) {
  return make_response(status, dump_json(body), "application/json", keep_alive, version);
}

// {"error":{"message","type","param","code"}} as OpenAI sends it.
inline nlohmann::json openai_error(const ApiError& e) {
  const int status = e.http_status();
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return {{"error",
           {{"message", e.what()},
            {"type", type},
            {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
            {"code", e.code}}}};
}

inline HttpResponse error_response(const ApiError& e, bool keep_alive, unsigned version = 11) {
  HttpResponse res = json_response(e.http_status(), openai_error(e), keep_alive, version);
  if (e.code == "overloaded") res.set(boost::beast::http::field::retry_after, "1");
  if (e.http_status() == 401) res.set(boost::beast::http::field::www_authenticate, "Bearer");
  return res;
}

}  // namespace specula::net
