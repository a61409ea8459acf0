// Command-line options: `--name value` and `--flag`, checked against what a command accepts.
#pragma once
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace specula::cli {

// A usage error: main prints it with the command's usage and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // argv[0] is the command name. `options` take a value; `flags` do not.
  Args(int argc, char** argv, const std::set<std::string>& options, const std::set<std::string>& flags);

  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) || flags_.count(name); }
  bool flag(const std::string& name) const { return flags_.count(name) != 0; }
  std::string str(const std::string& name, const std::string& fallback = "") const;
  // Numbers are checked: "--max-tokens abc" is a UsageError naming the option and the value.
  long long integer(const std::string& name, long long fallback) const;
  double number(const std::string& name, double fallback) const;
  // "1,2,3" -> {1, 2, 3}
  std::vector<int> int_list(const std::string& name) const;
  // A copy with option `name` set to `value` (a benchmark's grid of settings, one Args each).
  Args with(const std::string& name, const std::string& value) const {
    Args copy = *this;
    copy.values_[name] = value;
    return copy;
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  bool help_ = false;
};

}  // namespace specula::cli
