#include "gpu/host/weight_arena.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace specula {

std::shared_ptr<uint8_t> WeightArena::allocate(size_t bytes) {
  bytes = (bytes == 0 ? 64 : bytes + 63) / 64 * 64;
  std::shared_ptr<uint8_t> slab = slab_.lock();
  if (!slab || size_ - used_ < bytes) {
    const size_t size = (bytes > kSlabBytes ? bytes + kHugePage - 1 : kSlabBytes) / kHugePage * kHugePage;
    // Anonymous memory from mmap is zero and costs nothing until touched; std::aligned_alloc
    // over-allocates to reach 2 MiB alignment and may hand back a recycled (dirty) block, so
    // mmap is asked for one huge page more and trimmed to the aligned range.
    void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > base) munmap(raw, aligned - base);
    if (const uintptr_t end = base + size + kHugePage; end > aligned + size)
      munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
#ifdef MADV_HUGEPAGE
    madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);  // advice: failure changes nothing
#endif
    slab = std::shared_ptr<uint8_t>(reinterpret_cast<uint8_t*>(aligned), [size](uint8_t* p) { munmap(p, size); });
    slab_ = slab;
    size_ = size;
    used_ = 0;
  }
  std::shared_ptr<uint8_t> piece(slab, slab.get() + used_);  // shares the slab's ownership
  used_ += bytes;
  return piece;
}

}  // namespace specula
