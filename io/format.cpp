#include "io/format.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>

namespace seqrec::io {
namespace {

uint32_t crc_bytes(uint32_t crc, const void* data, size_t bytes) {
  // zlib treats a null buffer as "return the initial value": an empty array must not reset.
  if (bytes == 0) return crc;
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

}  // namespace

std::string shard_file_name(int64_t shard, int64_t num_shards) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05lld-of-%05lld.h5", static_cast<long long>(shard),
                static_cast<long long>(num_shards));
  return buf;
}

uint32_t shard_checksum(const ShardView& s) {
  const int64_t n = s.num_users(), e = s.num_events();
  uint32_t crc = static_cast<uint32_t>(crc32_z(0, nullptr, 0));
  crc = crc_bytes(crc, s.offsets, sizeof(int64_t) * (n + 1));
  crc = crc_bytes(crc, s.items, sizeof(int32_t) * e);
  if (s.timestamps) crc = crc_bytes(crc, s.timestamps, sizeof(int64_t) * e);
  if (s.user_features) crc = crc_bytes(crc, s.user_features, sizeof(int32_t) * n * s.num_features);
  return crc;
}

std::vector<int64_t> split_users_by_events(const std::vector<int64_t>& prefix, int64_t shards) {
  const int64_t users = static_cast<int64_t>(prefix.size()) - 1;
  const int64_t events = prefix.back();
  std::vector<int64_t> begin(shards + 1, 0);
  begin[shards] = users;
  for (int64_t s = 1; s < shards; ++s) {
    const double target = static_cast<double>(events) * s / shards;
    // The user boundary whose cumulative event count is nearest to the target.
    int64_t b = std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin();
    if (b > 0 && target - prefix[b - 1] < prefix[std::min(b, users)] - target) --b;
    const int64_t lo = begin[s - 1] + (users >= shards ? 1 : 0);
    const int64_t hi = users >= shards ? users - (shards - s) : users;
    begin[s] = std::clamp(b, lo, std::max(lo, hi));
  }
  return begin;
}

LengthStats length_stats(std::vector<int64_t> lengths, int64_t num_items) {
  LengthStats st;
  st.users = static_cast<int64_t>(lengths.size());
  if (lengths.empty()) return st;
  for (int64_t l : lengths) st.events += l;
  st.min = *std::min_element(lengths.begin(), lengths.end());
  st.max = *std::max_element(lengths.begin(), lengths.end());
  st.mean = static_cast<double>(st.events) / st.users;
  const size_t mid = lengths.size() / 2;
  std::nth_element(lengths.begin(), lengths.begin() + mid, lengths.end());
  st.median = static_cast<double>(lengths[mid]);
  if (lengths.size() % 2 == 0) {
    const int64_t lower = *std::max_element(lengths.begin(), lengths.begin() + mid);
    st.median = (st.median + lower) / 2.0;
  }
  st.density = num_items > 0 ? static_cast<double>(st.events) / (static_cast<double>(st.users) * num_items) : 0.0;
  return st;
}

}  // namespace seqrec::io
