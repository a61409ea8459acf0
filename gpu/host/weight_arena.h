// Memory for the packed weights: slabs aligned to 2 MiB and advised for transparent huge pages
// (madvise MADV_HUGEPAGE), handed out in 64-byte-aligned pieces.
//
// A decode step streams every matrix from DRAM once. With 4 KiB pages that is a TLB miss every
// 4 KiB and a hardware prefetcher that stops at each page boundary; with 2 MiB pages the stream
// crosses a page boundary 512 times less often. On a 2-core Zen 3 the default model's matrices
// streamed from DRAM took 0.80-0.92x the time at 1-3 rows (docs/kernels.md, "Huge pages for the
// weights"). Where the kernel's THP setting is "never" the advice is ignored and nothing changes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace specula {

// `bytes` rounded up to whole 2 MiB pages, mapped 2 MiB-aligned and advised MADV_HUGEPAGE: zero,
// and resident only once touched. Unmapped when the last owner lets go. Throws std::bad_alloc.
// The arena's slabs and the read-bandwidth buffer (the roofline's denominator) both come from here,
// so the weights and the bandwidth they are measured against stream through the same kind of page.
std::shared_ptr<uint8_t> map_huge_pages(size_t bytes);

class WeightArena {
 public:
  // A zero-filled piece of at least `bytes` bytes, 64-byte aligned; the shared pointer owns the
  // slab it lies in (so the slab lives while any of its pieces does). Throws std::bad_alloc.
  std::shared_ptr<uint8_t> allocate(size_t bytes);

  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kSlabBytes = size_t{32} << 20;  // a slab unless a piece needs more

 private:
  // The slab pieces are cut from; weak, so a slab whose pieces all died is freed, not kept.
  std::weak_ptr<uint8_t> slab_;
  size_t size_ = 0, used_ = 0;
};

}  // namespace specula
