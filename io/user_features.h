#pragma once
// Categorical user features from MovieLens-1M's users.dat
// (UserID::Gender::Age::Occupation::Zip-code), optionally joined to a dataset whose user
// ids differ through an id map ("dataset_id original_id" per line).
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace seqrec::io {

struct UserFeatureTable {
  std::vector<std::string> names;                // gender, age, occupation, zip_prefix
  std::vector<std::vector<std::string>> values;  // per feature: the value of code c at c - 1
  // canonical user id -> one code per feature (1..cardinality, 0 = unknown)
  std::unordered_map<std::string, std::vector<int32_t>> codes;
};

// Codes are assigned in sorted value order (numerically when every value is an integer),
// over all users of the file, so they do not depend on which users survive filtering.
UserFeatureTable read_ml1m_user_features(const std::string& path);

// dataset id -> original id, both canonical (see canonical_id).
std::unordered_map<std::string, std::string> read_id_map(const std::string& path);

}  // namespace seqrec::io
