#pragma once
// Raw interaction logs -> compact rows. Nothing per row is kept as text: user and item
// ids go through IdTable (one entry per distinct id), rows hold int32 indices into it.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/prepare.h"

namespace seqrec::io {

// Distinct raw ids in order of first appearance. Integer ids live in an open-addressing
// table (~25 bytes per id, no node allocations: Taobao has 4M items); with allow_strings
// (generic format) a non-integer id switches the table to strings for good.
class IdTable {
 public:
  explicit IdTable(bool allow_strings = false) : allow_strings_(allow_strings) {}

  int32_t index_of(int64_t id);
  // For allow_strings tables: canonical integers stay integers, anything else is a string.
  int32_t index_of(std::string_view token);

  int64_t size() const { return numeric_ ? static_cast<int64_t>(ints_.size()) : static_cast<int64_t>(strings_.size()); }
  bool numeric() const { return numeric_; }
  const std::vector<int64_t>& ints() const { return ints_; }
  const std::vector<std::string>& strings() const { return strings_; }
  std::string text(int32_t index) const { return numeric_ ? std::to_string(ints_[index]) : strings_[index]; }
  // Raw-id order: numeric for integer ids, lexicographic (bytes) for strings.
  bool less(int32_t a, int32_t b) const { return numeric_ ? ints_[a] < ints_[b] : strings_[a] < strings_[b]; }

 private:
  void grow();
  int32_t add_string(std::string_view token);

  // Key and index side by side: one cache miss per lookup of a random id.
#pragma pack(push, 4)
  struct Slot {
    int64_t key;
    int32_t index_plus_one;  // 0 = empty
  };
#pragma pack(pop)
  static_assert(sizeof(Slot) == 12, "Slot packs into 12 bytes");

  bool allow_strings_;
  bool numeric_ = true;
  std::vector<int64_t> ints_;
  std::vector<Slot> slots_;
  // Logs are usually grouped by user: the same id many times in a row skips the table.
  int64_t last_key_ = 0;
  int32_t last_index_ = -1;
  std::vector<std::string> strings_;
  std::unordered_map<std::string, int32_t> string_index_;
};

struct RawRows {
  std::vector<int32_t> user, item;  // IdTable indices, one per kept row, in file order
  std::vector<int64_t> time;        // empty when the format has no timestamps
  bool has_timestamps = false;
  IdTable users, items;
  std::string checksum;       // sha256 of the decompressed input
  int64_t rows_read = 0;      // data rows (header and blank lines excluded)
  std::vector<std::pair<std::string, int64_t>> counts;  // e.g. rows per taobao behavior
};

// Validates the format-related options (throws std::runtime_error naming the bad option).
void validate_format_options(const PrepareOptions& options);

// Reads the whole input; throws std::runtime_error "file:line: field 'x': ..." on bad rows.
RawRows read_raw(const PrepareOptions& options);

// "0042" and "42" name the same user in users.dat, an id map and a log: integers compare
// by value, anything else as written (trimmed).
std::string canonical_id(std::string_view token);

// Splitting and number parsing shared with the users.dat / id-map readers.
enum class Delimiter { kWhitespace, kDoubleColon, kChar };
// Splits `line` into at most max_fields + 1 fields (the +1 detects too many) and returns
// how many it found. Fields are trimmed of spaces and tabs.
size_t split_fields(std::string_view line, Delimiter kind, char ch, std::string_view* fields, size_t max_fields);
bool parse_int64(std::string_view s, int64_t& out);
bool parse_double(std::string_view s, double& out);

// "path:line: field 'name': 'value' problem"
[[noreturn]] void field_error(const std::string& path, int64_t line, const std::string& field, std::string_view value,
                              const std::string& problem);

}  // namespace seqrec::io
