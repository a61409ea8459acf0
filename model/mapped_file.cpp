// Read-only mmap of a model file; the mapping lives as long as any tensor view into it.
#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "model/tensor.h"

namespace specula {

namespace {

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
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace specula
