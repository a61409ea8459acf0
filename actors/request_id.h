// A request's id in the engine (given in arrival order), apart from the stream types that carry it.
#pragma once
#include <cstdint>

namespace specula::actors {

using RequestId = std::uint64_t;

}  // namespace specula::actors
