#include "io/user_features.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "io/raw_reader.h"
#include "io/text_input.h"

namespace seqrec::io {

UserFeatureTable read_ml1m_user_features(const std::string& path) {
  TextInput in(path);
  UserFeatureTable t;
  t.names = {"gender", "age", "occupation", "zip_prefix"};
  const size_t F = t.names.size();
  std::vector<std::string> ids;
  std::vector<std::vector<std::string>> raw;  // [user][feature]
  std::unordered_map<std::string, int64_t> line_of;
  std::string_view line, f[6];
  while (in.next_line(line)) {
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const int64_t ln = in.line_number();
    const size_t n = split_fields(line, Delimiter::kDoubleColon, ':', f, 5);
    if (n != 5)
      throw std::runtime_error(path + ":" + std::to_string(ln) + ": expected 5 fields " +
                               "'UserID::Gender::Age::Occupation::Zip-code', got " + (n > 5 ? "more" : std::to_string(n)));
    if (f[0].empty()) field_error(path, ln, "UserID", f[0], "is empty");
    std::string id = canonical_id(f[0]);
    auto [it, fresh] = line_of.emplace(id, ln);
    if (!fresh) field_error(path, ln, "UserID", f[0], "repeats line " + std::to_string(it->second));
    int64_t num;
    if (!f[2].empty() && !parse_int64(f[2], num)) field_error(path, ln, "Age", f[2], "is not an integer");
    if (!f[3].empty() && !parse_int64(f[3], num)) field_error(path, ln, "Occupation", f[3], "is not an integer");
    // The first character of the zip code is a coarse US region; the full code is too sparse.
    raw.push_back({std::string(f[1]), canonical_id(f[2]), canonical_id(f[3]), std::string(f[4].substr(0, 1))});
    ids.push_back(std::move(id));
  }
  if (ids.empty()) throw std::runtime_error(path + ": no users");

  t.values.resize(F);
  std::vector<std::map<std::string, int32_t>> code_of(F);
  for (size_t k = 0; k < F; ++k) {
    std::vector<std::string>& v = t.values[k];
    for (const auto& r : raw)
      if (!r[k].empty()) v.push_back(r[k]);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    const bool numeric = std::all_of(v.begin(), v.end(), [](const std::string& s) {
      int64_t x;
      return parse_int64(s, x);
    });
    if (numeric)
      std::sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
    for (size_t c = 0; c < v.size(); ++c) code_of[k][v[c]] = static_cast<int32_t>(c + 1);
  }
  for (size_t u = 0; u < ids.size(); ++u) {
    std::vector<int32_t> codes(F, 0);
    for (size_t k = 0; k < F; ++k)
      if (!raw[u][k].empty()) codes[k] = code_of[k][raw[u][k]];
    t.codes.emplace(ids[u], std::move(codes));
  }
  return t;
}

std::unordered_map<std::string, std::string> read_id_map(const std::string& path) {
  TextInput in(path);
  std::unordered_map<std::string, std::string> map;
  std::unordered_map<std::string, int64_t> line_of;
  std::string_view line, f[3];
  while (in.next_line(line)) {
    const int64_t ln = in.line_number();
    const size_t n = split_fields(line, Delimiter::kWhitespace, ' ', f, 2);
    if (n == 0) continue;
    if (n != 2)
      throw std::runtime_error(path + ":" + std::to_string(ln) + ": expected 2 fields 'dataset_id original_id', got " +
                               (n > 2 ? "more" : std::to_string(n)));
    std::string id = canonical_id(f[0]);
    auto [it, fresh] = line_of.emplace(id, ln);
    if (!fresh) field_error(path, ln, "dataset_id", f[0], "repeats line " + std::to_string(it->second));
    map.emplace(std::move(id), canonical_id(f[1]));
  }
  if (map.empty()) throw std::runtime_error(path + ": the id map is empty");
  return map;
}

}  // namespace seqrec::io
