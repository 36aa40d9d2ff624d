#include "io/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "io/h5.h"
#include "io/remove_tree.h"

namespace seqrec::io {
namespace fs = std::filesystem;
namespace {

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error(path + ": fsync failed: " + std::strerror(err));
}

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

void write_raw_ids(h5::File& f, const std::string& name, const RawIdList& ids, const std::string& description) {
  if (ids.numeric)
    f.write(f.root(), name, ids.ints);
  else
    f.write_strings(f.root(), name, ids.strings);
  h5::Object d(H5Dopen2(f.root(), name.c_str(), H5P_DEFAULT), H5Dclose);
  f.set_attr(d.id(), "description", description);
}

}  // namespace

void check_output_dir(const std::string& out) {
  if (out.empty()) throw std::runtime_error("output directory is not set");
  std::error_code ec;
  const auto st = fs::status(out, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) throw std::runtime_error(out + ": exists and is not a directory; refusing to overwrite");
  if (!fs::is_empty(out, ec))
    throw std::runtime_error(out + ": exists and is not empty; refusing to overwrite (remove it or choose another output)");
}

DatasetWriter::DatasetWriter(const std::string& out) : out_(strip_trailing_slashes(out)) {
  check_output_dir(out_);
  fs::path parent = fs::path(out_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw std::runtime_error(parent.string() + ": cannot create directory: " + ec.message());
  }
  std::string tmpl = out_ + ".tmp-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error(tmpl + ": cannot create temp directory: " + std::strerror(errno));
  tmp_ = tmpl;
}

DatasetWriter::~DatasetWriter() {
  if (!committed_ && !tmp_.empty()) {
    try_remove_tree(tmp_);  // best effort: an exception is already on its way
  }
}

void DatasetWriter::write_shard(int64_t index, int64_t num_shards, const ShardView& s) {
  const std::string path = tmp_ + "/" + shard_file_name(index, num_shards);
  h5::File f = h5::File::create(path);
  const hid_t r = f.root();
  f.set_attr(r, "format_version", static_cast<int64_t>(kFormatVersion));
  f.set_attr(r, "shard_index", index);
  f.set_attr(r, "num_shards", num_shards);
  f.set_attr(r, "user_begin", s.user_begin);
  f.set_attr(r, "user_end", s.user_end);
  f.set_attr(r, "num_events", s.num_events());
  f.write(r, "offsets", s.offsets, {static_cast<hsize_t>(s.num_users() + 1)});
  f.write(r, "items", s.items, {static_cast<hsize_t>(s.num_events())});
  if (s.timestamps) f.write(r, "timestamps", s.timestamps, {static_cast<hsize_t>(s.num_events())});
  if (s.user_features)
    f.write(r, "user_features", s.user_features,
            {static_cast<hsize_t>(s.num_users()), static_cast<hsize_t>(s.num_features)});
  f.close();
  if (static_cast<int64_t>(checksums_.size()) <= index) {
    checksums_.resize(index + 1, 0);
    events_.resize(index + 1, -1);
  }
  checksums_[index] = shard_checksum(s);
  events_[index] = s.num_events();
}

void DatasetWriter::write_meta(DatasetMeta& meta, const MetaExtras& x) {
  if (static_cast<int64_t>(events_.size()) != meta.num_shards)
    throw std::logic_error("DatasetWriter: meta written before all shards");
  for (int64_t e : events_)
    if (e < 0) throw std::logic_error("DatasetWriter: a shard was not written");
  meta.shard_checksums = checksums_;
  meta.shard_num_events = events_;

  h5::File f = h5::File::create(tmp_ + "/" + kMetaFile);
  const hid_t r = f.root();
  f.set_attr(r, "format_version", static_cast<int64_t>(meta.format_version));
  f.set_attr(r, "name", meta.name);
  f.set_attr(r, "source_format", meta.source_format);
  f.set_attr(r, "source_checksum", meta.source_checksum);
  f.set_attr(r, "num_users", meta.num_users);
  f.set_attr(r, "num_items", meta.num_items);
  f.set_attr(r, "num_events", meta.num_events);
  f.set_attr(r, "num_shards", meta.num_shards);
  f.set_attr(r, "has_timestamps", static_cast<int64_t>(meta.has_timestamps));
  f.set_attr(r, "item_padding_id", static_cast<int64_t>(0));
  f.write(r, "shard_user_begin", meta.shard_user_begin);
  f.write(r, "shard_checksums", meta.shard_checksums);
  {
    h5::Object d(H5Dopen2(r, "shard_checksums", H5P_DEFAULT), H5Dclose);
    f.set_attr(d.id(), "description",
               std::string("crc32 of each shard's offsets, items, timestamps, user_features values (little-endian)"));
  }
  f.write(r, "shard_num_events", meta.shard_num_events);
  f.write_strings(r, "user_feature_names", meta.user_feature_names);
  f.write(r, "user_feature_cardinalities", meta.user_feature_cardinalities);
  if (!x.user_feature_values.empty()) {
    h5::Object g = f.create_group("user_feature_values");
    for (size_t i = 0; i < x.user_feature_values.size(); ++i)
      f.write_strings(g.id(), meta.user_feature_names.at(i), x.user_feature_values[i]);
    f.set_attr(g.id(), "description", std::string("raw value of feature code c at index c-1; code 0 = unknown"));
  }
  if (x.has_raw_ids) {
    write_raw_ids(f, "user_raw_ids", x.user_raw_ids, "raw id of dense user u at index u");
    write_raw_ids(f, "item_raw_ids", x.item_raw_ids, "raw id of dense item i at index i-1 (item 0 is padding)");
  }
  {
    h5::Object g = f.create_group("stats");
    for (const auto& [k, v] : x.int_stats) f.set_attr(g.id(), k, v);
    for (const auto& [k, v] : x.real_stats) f.set_attr(g.id(), k, v);
  }
  {
    h5::Object g = f.create_group("attributes");
    for (const auto& [k, v] : meta.attributes) f.set_attr(g.id(), k, v);
  }
  f.close();
}

void DatasetWriter::commit() {
  for (const auto& entry : fs::directory_iterator(tmp_)) fsync_path(entry.path().string());
  fsync_path(tmp_);
  check_output_dir(out_);  // someone may have created it while we worked
  // rename(2) replaces an empty directory and fails on a non-empty one: no data is lost.
  if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
    throw std::runtime_error(out_ + ": cannot rename " + tmp_ + " into place: " + std::strerror(errno));
  committed_ = true;
  std::string parent = fs::path(out_).parent_path().string();
  fsync_path(parent.empty() ? "." : parent);
}

void add_length_stats(const LengthStats& st, MetaExtras& x) {
  x.int_stats.emplace_back("seq_len_min", st.min);
  x.int_stats.emplace_back("seq_len_max", st.max);
  x.real_stats.emplace_back("seq_len_median", st.median);
  x.real_stats.emplace_back("seq_len_mean", st.mean);
  x.real_stats.emplace_back("density", st.density);
}

}  // namespace seqrec::io
