#include "io/raw_reader.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "io/progress.h"
#include "io/text_input.h"

namespace seqrec::io {
namespace {

constexpr int64_t kMaxIds = std::numeric_limits<int32_t>::max();

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

enum class Col { kUser, kItem, kTime, kRating, kBehavior, kIgnore };

struct FormatSpec {
  Delimiter delim = Delimiter::kChar;
  char ch = ',';
  std::vector<Col> cols;
  std::string layout;           // for "expected N fields (layout)"
  std::string required_header;  // exact first line, or ""
  bool skip_header = false;     // generic --header: skip the first line, whatever it says
  bool string_ids = false;
};

const char* kFormats = "sasrec, ml-1m, ml-20m, ml-25m, taobao, generic";
const std::array<const char*, 4> kBehaviors = {"pv", "buy", "cart", "fav"};

int behavior_code(std::string_view s) {
  for (size_t i = 0; i < kBehaviors.size(); ++i)
    if (s == kBehaviors[i]) return static_cast<int>(i);
  return -1;
}

FormatSpec spec_for(const PrepareOptions& o) {
  FormatSpec s;
  const std::string& f = o.format;
  if (f == "sasrec") {
    s.delim = Delimiter::kWhitespace;
    s.cols = {Col::kUser, Col::kItem};
    s.layout = "'user item'";
  } else if (f == "ml-1m") {
    s.delim = Delimiter::kDoubleColon;
    s.cols = {Col::kUser, Col::kItem, Col::kRating, Col::kTime};
    s.layout = "'UserID::MovieID::Rating::Timestamp'";
  } else if (f == "ml-25m" || f == "ml-20m") {
    s.cols = {Col::kUser, Col::kItem, Col::kRating, Col::kTime};
    s.layout = "'userId,movieId,rating,timestamp'";
    s.required_header = "userId,movieId,rating,timestamp";
  } else if (f == "taobao") {
    s.cols = {Col::kUser, Col::kItem, Col::kIgnore, Col::kBehavior, Col::kTime};
    s.layout = "'user,item,category,behavior,timestamp'";
  } else if (f == "generic") {
    s.ch = o.delimiter;
    s.delim = o.delimiter == ' ' ? Delimiter::kWhitespace : Delimiter::kChar;
    s.skip_header = o.header;
    s.string_ids = true;
    std::string layout;
    for (const auto& c : o.columns) {
      layout += (layout.empty() ? "" : std::string(1, o.delimiter)) + c;
      if (c == "user") s.cols.push_back(Col::kUser);
      else if (c == "item") s.cols.push_back(Col::kItem);
      else if (c == "time") s.cols.push_back(Col::kTime);
      else if (c == "rating") s.cols.push_back(Col::kRating);
      else s.cols.push_back(Col::kIgnore);
    }
    s.layout = "'" + layout + "'";
  } else {
    throw std::runtime_error("unknown format '" + f + "'; valid formats: " + kFormats);
  }
  return s;
}

bool has_col(const FormatSpec& s, Col c) {
  for (Col x : s.cols)
    if (x == c) return true;
  return false;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

void field_error(const std::string& path, int64_t line, const std::string& field, std::string_view value,
                 const std::string& problem) {
  std::string v(value.substr(0, 80));
  throw std::runtime_error(path + ":" + std::to_string(line) + ": field '" + field + "': '" + v + "' " + problem);
}

size_t split_fields(std::string_view line, Delimiter kind, char ch, std::string_view* fields, size_t max_fields) {
  size_t n = 0;
  if (kind == Delimiter::kWhitespace) {
    size_t i = 0;
    while (n <= max_fields) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (i == line.size()) break;
      const size_t start = i;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
      fields[n++] = line.substr(start, i - start);
    }
    return n;
  }
  const size_t width = kind == Delimiter::kDoubleColon ? 2 : 1;
  size_t start = 0;
  while (n <= max_fields) {
    const size_t at = kind == Delimiter::kDoubleColon ? line.find("::", start) : line.find(ch, start);
    if (at == std::string_view::npos) {
      fields[n++] = trim(line.substr(start));
      break;
    }
    fields[n++] = trim(line.substr(start, at - start));
    start = at + width;
  }
  return n;
}

bool parse_int64(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(out);
}

std::string canonical_id(std::string_view token) {
  token = trim(token);
  int64_t v;
  if (parse_int64(token, v)) return std::to_string(v);
  return std::string(token);
}

void IdTable::grow() {
  const size_t cap = slots_.empty() ? 1024 : slots_.size() * 2;
  std::vector<Slot> fresh(cap, Slot{0, 0});
  for (size_t i = 0; i < ints_.size(); ++i) {
    size_t h = mix(static_cast<uint64_t>(ints_[i])) & (cap - 1);
    while (fresh[h].index_plus_one) h = (h + 1) & (cap - 1);
    fresh[h] = Slot{ints_[i], static_cast<int32_t>(i + 1)};
  }
  slots_.swap(fresh);
}

int32_t IdTable::index_of(int64_t id) {
  if (!numeric_) return add_string(std::to_string(id));
  if (id == last_key_ && last_index_ >= 0) return last_index_;
  // Load factor <= 0.7 keeps linear probing short.
  if ((ints_.size() + 1) * 10 > slots_.size() * 7) grow();
  const size_t mask = slots_.size() - 1;
  size_t h = mix(static_cast<uint64_t>(id)) & mask;
  int32_t index;
  for (;;) {
    const Slot& s = slots_[h];
    if (s.index_plus_one == 0) {
      if (static_cast<int64_t>(ints_.size()) >= kMaxIds) throw std::runtime_error("more than 2^31-1 distinct ids");
      ints_.push_back(id);
      index = static_cast<int32_t>(ints_.size() - 1);
      slots_[h] = Slot{id, index + 1};
      break;
    }
    if (s.key == id) {
      index = s.index_plus_one - 1;
      break;
    }
    h = (h + 1) & mask;
  }
  last_key_ = id;
  last_index_ = index;
  return index;
}

int32_t IdTable::index_of(std::string_view token) {
  if (numeric_) {
    int64_t v;
    // Only the canonical spelling stays numeric ("007" must not merge with "7": it would
    // not come back the same from the stored raw ids).
    if (parse_int64(token, v) && std::to_string(v) == token) return index_of(v);
    if (!allow_strings_) throw std::logic_error("IdTable: string id in a numeric table");
    // Switch to strings: the integers seen so far become their decimal text, same indices.
    numeric_ = false;
    strings_.reserve(ints_.size());
    for (int64_t x : ints_) add_string(std::to_string(x));
    ints_.clear();
    ints_.shrink_to_fit();
    slots_.clear();
    slots_.shrink_to_fit();
    last_index_ = -1;
  }
  return add_string(token);
}

int32_t IdTable::add_string(std::string_view token) {
  auto [it, inserted] = string_index_.try_emplace(std::string(token), static_cast<int32_t>(strings_.size()));
  if (inserted) {
    if (static_cast<int64_t>(strings_.size()) >= kMaxIds) throw std::runtime_error("more than 2^31-1 distinct ids");
    strings_.push_back(it->first);
  }
  return it->second;
}

void validate_format_options(const PrepareOptions& o) {
  if (o.format.empty()) throw std::runtime_error(std::string("format is not set; valid formats: ") + kFormats);
  if (o.format == "generic") {
    int user = 0, item = 0, time = 0, rating = 0;
    for (const auto& c : o.columns) {
      if (c == "user") ++user;
      else if (c == "item") ++item;
      else if (c == "time") ++time;
      else if (c == "rating") ++rating;
      else if (c != "ignore")
        throw std::runtime_error("generic format: unknown column '" + c + "'; valid: user, item, time, rating, ignore");
    }
    if (user != 1 || item != 1 || time > 1 || rating > 1)
      throw std::runtime_error("generic format: columns need exactly one 'user' and one 'item', at most one 'time' and one "
                               "'rating'");
    if (o.delimiter == '\n' || o.delimiter == '\r' || o.delimiter == '\0')
      throw std::runtime_error("generic format: invalid delimiter");
  }
  const FormatSpec spec = spec_for(o);  // throws for unknown formats
  if (o.has_min_rating && !has_col(spec, Col::kRating))
    throw std::runtime_error("min_rating: format '" + o.format + "' has no ratings");
  if (!o.behaviors.empty() && o.format != "taobao")
    throw std::runtime_error("behaviors: applies only to the taobao format, not '" + o.format + "'");
  for (const auto& b : o.behaviors)
    if (behavior_code(b) < 0) throw std::runtime_error("behaviors: unknown behavior '" + b + "'; valid: pv, buy, cart, fav");
}

RawRows read_raw(const PrepareOptions& o) {
  validate_format_options(o);
  const FormatSpec spec = spec_for(o);
  TextInput in(o.input);
  const std::string& path = o.input;
  const std::string short_name = std::filesystem::path(path).filename().string();

  RawRows rows;
  rows.users = IdTable(spec.string_ids);
  rows.items = IdTable(spec.string_ids);
  rows.has_timestamps = has_col(spec, Col::kTime);
  bool keep_behavior[4] = {o.behaviors.empty(), o.behaviors.empty(), o.behaviors.empty(), o.behaviors.empty()};
  for (const auto& b : o.behaviors) keep_behavior[behavior_code(b)] = true;
  int64_t behavior_rows[4] = {0, 0, 0, 0};
  int64_t below_rating = 0;

  const size_t ncols = spec.cols.size();
  std::vector<std::string_view> fields(ncols + 1);
  Progress progress(o.progress, "prepare");
  bool first_line = true;
  std::string_view line;
  while (in.next_line(line)) {
    if (first_line && line.size() >= 3 && std::memcmp(line.data(), "\xEF\xBB\xBF", 3) == 0) line.remove_prefix(3);
    if (trim(line).empty()) continue;
    if (first_line) {
      first_line = false;
      if (!spec.required_header.empty()) {
        if (trim(line) != spec.required_header)
          throw std::runtime_error(path + ":" + std::to_string(in.line_number()) + ": expected the header '" +
                                   spec.required_header + "', got '" + std::string(line.substr(0, 80)) + "'");
        continue;
      }
      if (spec.skip_header) continue;
    }
    const int64_t ln = in.line_number();
    const size_t n = split_fields(line, spec.delim, spec.ch, fields.data(), ncols);
    if (n != ncols)
      throw std::runtime_error(path + ":" + std::to_string(ln) + ": expected " + std::to_string(ncols) + " fields " +
                               spec.layout + ", got " + (n > ncols ? "more" : std::to_string(n)) + ": '" +
                               std::string(line.substr(0, 80)) + "'");
    if ((++rows.rows_read & 0xffff) == 0 && progress.due()) {
      const double done = static_cast<double>(in.compressed_position()), total = static_cast<double>(in.file_size());
      char pct[16];
      std::snprintf(pct, sizeof(pct), "%.0f%%", total > 0 ? 100.0 * done / total : 0.0);
      progress.print(short_name + ": " + std::to_string(rows.rows_read) + " rows, " +
                     Progress::rate(rows.rows_read / progress.elapsed_s()) + "rows/s, " + pct + " of the input, ETA " +
                     progress.eta(done, total));
    }

    std::string_view user_tok, item_tok;
    int64_t user = 0, item = 0, time = 0;
    double rating = 0;
    int behavior = -1;
    for (size_t c = 0; c < ncols; ++c) {
      const std::string_view v = fields[c];
      switch (spec.cols[c]) {
        case Col::kUser:
          user_tok = v;
          if (v.empty()) field_error(path, ln, "user", v, "is empty");
          if (!spec.string_ids && !parse_int64(v, user)) field_error(path, ln, "user", v, "is not an integer");
          break;
        case Col::kItem:
          item_tok = v;
          if (v.empty()) field_error(path, ln, "item", v, "is empty");
          if (!spec.string_ids && !parse_int64(v, item)) field_error(path, ln, "item", v, "is not an integer");
          break;
        case Col::kTime:
          if (!parse_int64(v, time)) field_error(path, ln, "timestamp", v, "is not an integer");
          break;
        case Col::kRating:
          if (!parse_double(v, rating)) field_error(path, ln, "rating", v, "is not a number");
          break;
        case Col::kBehavior:
          behavior = behavior_code(v);
          if (behavior < 0) field_error(path, ln, "behavior", v, "is not one of pv, buy, cart, fav");
          break;
        case Col::kIgnore: break;
      }
    }
    if (behavior >= 0) {
      ++behavior_rows[behavior];
      if (!keep_behavior[behavior]) continue;
    }
    if (o.has_min_rating && rating < o.min_rating) {
      ++below_rating;
      continue;
    }
    rows.user.push_back(spec.string_ids ? rows.users.index_of(user_tok) : rows.users.index_of(user));
    rows.item.push_back(spec.string_ids ? rows.items.index_of(item_tok) : rows.items.index_of(item));
    if (rows.has_timestamps) rows.time.push_back(time);

  }
  rows.checksum = in.sha256_hex();
  if (rows.rows_read == 0) throw std::runtime_error(path + ": no interactions (the input has no data rows)");
  if (has_col(spec, Col::kBehavior))
    for (size_t b = 0; b < kBehaviors.size(); ++b) rows.counts.emplace_back(std::string("rows_") + kBehaviors[b], behavior_rows[b]);
  if (o.has_min_rating) rows.counts.emplace_back("rows_below_min_rating", below_rating);
  progress.print(short_name + ": " + std::to_string(rows.rows_read) + " rows read in " +
                 std::to_string(progress.elapsed_s()).substr(0, 5) + " s (" + in.compression() + ")");
  return rows;
}

}  // namespace seqrec::io
