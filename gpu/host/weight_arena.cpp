#include "gpu/host/weight_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace specula {

std::shared_ptr<uint8_t> map_huge_pages(size_t bytes) {
  constexpr size_t kPage = WeightArena::kHugePage;
  const size_t size = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  // mmap aligns to 4 KiB only: ask for one huge page more and trim to the aligned range.
  void* raw = mmap(nullptr, size + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kPage - 1) / kPage * kPage;
  if (aligned > base) munmap(raw, aligned - base);
  if (const uintptr_t end = base + size + kPage; end > aligned + size)
    munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);  // advice: failure changes nothing
#endif
  return std::shared_ptr<uint8_t>(reinterpret_cast<uint8_t*>(aligned), [size](uint8_t* p) { munmap(p, size); });
}

std::shared_ptr<uint8_t> WeightArena::allocate(size_t bytes) {
  bytes = (bytes == 0 ? 64 : bytes + 63) / 64 * 64;
  std::shared_ptr<uint8_t> slab = slab_.lock();
  if (!slab || size_ - used_ < bytes) {
    const size_t size = (std::max(bytes, kSlabBytes) + kHugePage - 1) / kHugePage * kHugePage;
    slab = map_huge_pages(size);
    slab_ = slab;
    size_ = size;
    used_ = 0;
  }
  std::shared_ptr<uint8_t> piece(slab, slab.get() + used_);  // shares the slab's ownership
  used_ += bytes;
  return piece;
}

}  // namespace specula
