// Failure reporting shared by every actor.
#include "actors/actor.h"

#include <cstdio>

namespace specula::actors {

std::string describe(const std::exception_ptr& error) {
  if (!error) return "no error";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void report_to_stderr(std::string_view actor, std::string_view what) {
  std::fprintf(stderr, "specula: actor '%.*s': %.*s\n", static_cast<int>(actor.size()), actor.data(),
               static_cast<int>(what.size()), what.data());
}

}  // namespace specula::actors
