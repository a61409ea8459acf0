#include "tools/specula/args.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

namespace specula::cli {

Args::Args(int argc, char** argv, const std::set<std::string>& options, const std::set<std::string>& flags) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") { help_ = true; continue; }
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) { value = name.substr(eq + 1); name = name.substr(0, eq); }
    if (flags.count(name)) {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      flags_.insert(name);
    } else if (options.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      throw UsageError("unknown option --" + name);
    }
  }
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

long long Args::integer(const std::string& name, long long fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end || errno) throw UsageError("--" + name + " expects an integer, got '" + it->second + "'");
  return v;
}

double Args::number(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end || errno) throw UsageError("--" + name + " expects a number, got '" + it->second + "'");
  return v;
}

std::vector<int> Args::int_list(const std::string& name) const {
  std::vector<int> out;
  const std::string s = str(name);
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find_first_of(", ", i);
    if (j == std::string::npos) j = s.size();
    if (j > i) {
      const std::string item = s.substr(i, j - i);
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (*end) throw UsageError("--" + name + " expects integers separated by commas, got '" + item + "'");
      if (errno == ERANGE || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
        throw UsageError("--" + name + ": " + item + " is out of range");
      out.push_back(static_cast<int>(v));
    }
    i = j + 1;
  }
  return out;
}

}  // namespace specula::cli
