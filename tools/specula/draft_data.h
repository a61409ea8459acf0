// The draft data format in C++ (docs/draft.md, "Data format"; tools/draft/data_format.py is its
// Python twin): the `.spd` files `specula draft-data` appends to and `specula draft-eval` reads.
// Little-endian, no padding: a 32-byte header ("SPDRAFT1", u32 version, u32 H, u32 K, u32 V, then
// version 1: 8 zero bytes; version 2: u32 C, u32 0, and C u32 feature layers after the header),
// then records until the end of the file. A row of `hidden` is H x (1 + C) values: the final
// hidden state, then the residual after each feature layer, RMS-normalised (LlamaModel's features).
#pragma once
#include <cstdint>
#include <cstdio>
#include <istream>
#include <string>
#include <vector>

namespace specula::cli::draft_data {

struct Header {
  uint32_t hidden = 0, topk = 0, vocab = 0;  // H, K, V
  std::vector<uint32_t> feature_layers;      // C layer indices (version 2; empty: version 1)
  uint32_t row_width() const { return hidden * (1 + static_cast<uint32_t>(feature_layers.size())); }
  bool operator==(const Header&) const = default;
};

// One sequence of T tokens, the first n_prompt of them the prompt.
struct Record {
  uint32_t n_prompt = 0;
  std::vector<int32_t> tokens;       // [T]
  std::vector<uint16_t> hidden;      // [T, row_width] fp16: the target's features while feeding token t
  std::vector<int32_t> topk_ids;     // [T, K] the most probable next tokens, most probable first
  std::vector<uint16_t> topk_probs;  // [T, K] fp16, softmax at temperature 1
};

// The header of `in`; `what` names the file in messages ("--data PATH"). Throws UsageError for a
// file shorter than a header or without the magic and version 1 or 2.
Header read_header(std::istream& in, const std::string& what);

// Opens `path` for appending: a new or empty file gets `h` as its header; an existing one must
// have that header (UsageError naming both otherwise). Messages name it as "--out PATH".
std::FILE* open_for_append(const std::string& path, const Header& h);

// Appends and flushes one record (a crash leaves whole records). Throws std::runtime_error when
// the write fails.
void append(std::FILE* f, const Record& r);

// The next record of `in`; false at the end of the file. Throws UsageError for a record that runs
// past the end.
bool read_record(std::istream& in, const Header& h, Record& r, const std::string& what);

}  // namespace specula::cli::draft_data
