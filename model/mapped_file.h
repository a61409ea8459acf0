// A read-only memory-mapped file.
#pragma once
#include <cstddef>
#include <string>

namespace specula {

class MappedFile {
 public:
  // Throws ModelError naming the path and the OS error.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Drops this process's pages of the whole pages inside [p, p + n) where that range lies in a live
// MappedFile (madvise MADV_DONTNEED): the page cache keeps them, the file is untouched, and a later
// read faults them back in with the same bytes. For a tensor read once, to be repacked into memory
// of the device's own, so that the process does not hold both copies. Memory that is not a mapped
// file is left alone (there MADV_DONTNEED would zero it). Returns the bytes released.
size_t release_mapped_pages(const void* p, size_t n);

}  // namespace specula
