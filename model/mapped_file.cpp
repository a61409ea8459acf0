// Read-only mmap of a model file; the mapping lives as long as any tensor view into it.
#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "model/tensor.h"

namespace specula {

namespace {

// The live mappings (start -> size), for release_mapped_pages.
std::mutex& mappings_mutex() {
  static std::mutex m;
  return m;
}
std::map<const std::byte*, size_t>& mappings() {
  static std::map<const std::byte*, size_t> m;
  return m;
}

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw ModelError("cannot " + std::string(what) + " '" + path + "': " + std::strerror(err));
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "open", errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(path, "stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ModelError("cannot read '" + path + "': " + (S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file"));
  }
  if (st.st_size == 0) {
    ::close(fd);
    throw ModelError("cannot read '" + path + "': the file is empty");
  }
  size_ = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (p == MAP_FAILED) fail(path, "mmap", err);
  data_ = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(mappings_mutex());
  mappings()[data_] = size_;
}

MappedFile::~MappedFile() {
  if (!data_) return;
  {
    std::lock_guard<std::mutex> lock(mappings_mutex());
    mappings().erase(data_);
  }
  ::munmap(const_cast<std::byte*>(data_), size_);
}

size_t release_mapped_pages(const void* p, size_t n) {
  const auto* begin = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(mappings_mutex());
  auto it = mappings().upper_bound(begin);
  if (it == mappings().begin()) return 0;
  --it;  // the last mapping starting at or before p
  const uintptr_t start = reinterpret_cast<uintptr_t>(begin), first = reinterpret_cast<uintptr_t>(it->first);
  if (start - first > it->second || n > it->second - (start - first)) return 0;  // not inside it
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (start + page - 1) / page * page;
  const uintptr_t hi = (start + n) / page * page;
  if (hi <= lo) return 0;
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0) return 0;
  return hi - lo;
}

}  // namespace specula
