// WeightArena: the packed weights' memory (2 MiB-aligned slabs advised for huge pages).
#include "gpu/host/weight_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/host/host_device.h"
#include "gpu/host/qmatmul.h"

namespace specula {
namespace {

// The VmFlags line of the /proc/self/smaps mapping that contains p ("" if none is found).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

std::string thp_setting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s;
}

TEST(WeightArena, PiecesAreZeroedAlignedAndConsecutiveInOneHugePageAlignedSlab) {
  WeightArena arena;
  std::vector<std::shared_ptr<uint8_t>> pieces;
  for (size_t bytes : {1u, 100u, 4096u, 70000u, 64u}) pieces.push_back(arena.allocate(bytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pieces[0].get()) % WeightArena::kHugePage, 0u);
  const size_t rounded[] = {64, 128, 4096, 70016};
  for (size_t i = 1; i < pieces.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pieces[i].get()) % 64, 0u);
    EXPECT_EQ(pieces[i].get(), pieces[i - 1].get() + rounded[i - 1]) << "piece " << i;
  }
  for (const auto& p : pieces)
    for (size_t k = 0; k < 64; ++k) ASSERT_EQ(p.get()[k], 0);
  // Every piece is writable to its end without touching its neighbour.
  std::fill_n(pieces[3].get(), 70000, uint8_t{0xAB});
  EXPECT_EQ(pieces[4].get()[0], 0);
}

TEST(WeightArena, APieceLargerThanASlabGetsASlabOfItsOwnAndTheNextPieceANewOne) {
  WeightArena arena;
  auto small = arena.allocate(1000);
  const size_t big_bytes = WeightArena::kSlabBytes + 5000;
  auto big = arena.allocate(big_bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.get()) % WeightArena::kHugePage, 0u);
  big.get()[big_bytes - 1] = 7;  // the whole piece is mapped
  auto after = arena.allocate(64);
  EXPECT_EQ(after.get(), big.get() + (big_bytes + 63) / 64 * 64);  // cut from the big slab's tail
}

TEST(WeightArena, ASlabIsFreedWhenItsPiecesAllDieAndTheNextPieceStartsANewOne) {
  WeightArena arena;
  const uint8_t* first = nullptr;
  {
    auto a = arena.allocate(4096);
    first = a.get();
    auto b = arena.allocate(4096);
    EXPECT_EQ(b.get(), first + 4096);
  }
  // Both pieces died, so the slab was unmapped; the next piece starts a new slab at its start.
  auto c = arena.allocate(64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.get()) % WeightArena::kHugePage, 0u);
  EXPECT_NE(vm_flags_of(c.get()), "");
}

TEST(WeightArena, SlabsAreAdvisedForTransparentHugePagesWhereTheKernelOffersThem) {
  const std::string thp = thp_setting();
  if (thp.empty() || thp.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off or absent here (" << thp << ")";
  WeightArena arena;
  auto p = arena.allocate(1 << 20);
  const std::string flags = vm_flags_of(p.get());
  ASSERT_NE(flags, "") << "no mapping found for the piece in /proc/self/smaps";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;  // hg: MADV_HUGEPAGE
}

TEST(WeightArena, TheHostDevicePacksEveryMatrixIntoItsArena) {
  const std::string thp = thp_setting();
  if (thp.empty() || thp.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off or absent here (" << thp << ")";
  HostOps ops(1, host_kernels::host_path_for("portable"));  // the int8 path packs on every CPU
  std::vector<std::byte> bytes(dtype_row_bytes(DType::Q4_1, 256) * 64);
  TensorView t{"w", DType::Q4_1, {64, 256}, bytes.data(), bytes.size()};
  Weight w = ops.upload(t);
  ASSERT_NE(w.device, nullptr);
  const auto* m = static_cast<const PackedMatrix*>(w.device);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data.get()) % WeightArena::kHugePage, 0u);
  EXPECT_NE(vm_flags_of(m->data.get()).find(" hg"), std::string::npos);
}

}  // namespace
}  // namespace specula
