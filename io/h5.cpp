#include "io/h5.h"

#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace seqrec::io::h5 {
namespace {

// Collects the innermost HDF5 error description (where the problem was detected: "truncated
// file: eof = ...", "bad object header version number", ...).
herr_t innermost_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err && err->desc) *out = err->desc;
  return 0;
}

std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason;
}

Object make_string_type(size_t chars) {
  Object t(H5Tcopy(H5T_C_S1), H5Tclose);
  // NULLTERM counts the terminator in the size; a size of 1 stores the empty string.
  H5Tset_size(t.id(), chars + 1);
  H5Tset_strpad(t.id(), H5T_STR_NULLTERM);
  H5Tset_cset(t.id(), H5T_CSET_UTF8);
  return t;
}

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

void fail(const std::string& file, const std::string& what) {
  std::string reason = hdf5_reason();
  throw std::runtime_error(file + ": " + what + (reason.empty() ? "" : " (HDF5: " + reason + ")"));
}

Object& Object::operator=(Object&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Object::reset() {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
}

File File::create(const std::string& path) {
  init();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) h5::fail(path, "cannot create HDF5 file");
  return File(path, Object(id, H5Fclose));
}

File File::open(const std::string& path, const std::string& missing_hint) {
  init();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error(path + ": missing" + (missing_hint.empty() ? "" : " (" + missing_hint + ")"));
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + ": not a regular file");
  const htri_t is = H5Fis_hdf5(path.c_str());
  if (is <= 0) {
    hdf5_reason();
    throw std::runtime_error(path + ": not an HDF5 file (empty, truncated or overwritten?)");
  }
  Object fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  // Parallel file systems (Lustre, NFS) often refuse flock; a read-only open needs no lock
  // to be safe, so a refused lock must not stop every rank of a multi-node job.
  H5Pset_file_locking(fapl.id(), true, /*ignore_when_disabled=*/true);
#endif
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id());
  if (id < 0) h5::fail(path, "cannot open HDF5 file (truncated or corrupt?)");
  return File(path, Object(id, H5Fclose));
}

void File::close() {
  if (file_.id() < 0) return;
  if (H5Fflush(file_.id(), H5F_SCOPE_LOCAL) < 0) fail("cannot flush");
  if (H5Fclose(file_.release()) < 0) fail("cannot close");
}

Object File::create_group(const std::string& name) {
  hid_t g = H5Gcreate2(root(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) fail("cannot create group '" + name + "'");
  return Object(g, H5Gclose);
}

bool File::has(hid_t parent, const std::string& name) const {
  const htri_t r = H5Lexists(parent, name.c_str(), H5P_DEFAULT);
  if (r < 0) fail("cannot look up '" + name + "'");
  return r > 0;
}

Object File::open_group(const std::string& name) const {
  hid_t g = H5Gopen2(root(), name.c_str(), H5P_DEFAULT);
  if (g < 0) fail("cannot open group '" + name + "'");
  return Object(g, H5Gclose);
}

void File::set_attr(hid_t obj, const std::string& name, int64_t value) {
  Object space(H5Screate(H5S_SCALAR), H5Sclose);
  Object a(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.id() < 0 || H5Awrite(a.id(), H5T_NATIVE_INT64, &value) < 0) fail("cannot write attribute '" + name + "'");
}

void File::set_attr(hid_t obj, const std::string& name, double value) {
  Object space(H5Screate(H5S_SCALAR), H5Sclose);
  Object a(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.id() < 0 || H5Awrite(a.id(), H5T_NATIVE_DOUBLE, &value) < 0) fail("cannot write attribute '" + name + "'");
}

void File::set_attr(hid_t obj, const std::string& name, const std::string& value) {
  Object type = make_string_type(value.size());
  Object space(H5Screate(H5S_SCALAR), H5Sclose);
  Object a(H5Acreate2(obj, name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.id() < 0 || H5Awrite(a.id(), type.id(), value.c_str()) < 0) fail("cannot write attribute '" + name + "'");
}

bool File::has_attr(hid_t obj, const std::string& name) const {
  const htri_t r = H5Aexists(obj, name.c_str());
  if (r < 0) fail("cannot look up attribute '" + name + "'");
  return r > 0;
}

Object File::open_attr(hid_t obj, const std::string& name) const {
  if (!has_attr(obj, name)) throw std::runtime_error(path_ + ": attribute '" + name + "' is missing");
  hid_t a = H5Aopen(obj, name.c_str(), H5P_DEFAULT);
  if (a < 0) fail("cannot open attribute '" + name + "'");
  return Object(a, H5Aclose);
}

int64_t File::attr_int(hid_t obj, const std::string& name) const {
  Object a = open_attr(obj, name);
  Object type(H5Aget_type(a.id()), H5Tclose);
  if (H5Tget_class(type.id()) != H5T_INTEGER)
    throw std::runtime_error(path_ + ": attribute '" + name + "' is not an integer");
  int64_t v = 0;
  if (H5Aread(a.id(), H5T_NATIVE_INT64, &v) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

double File::attr_double(hid_t obj, const std::string& name) const {
  Object a = open_attr(obj, name);
  double v = 0;
  if (H5Aread(a.id(), H5T_NATIVE_DOUBLE, &v) < 0) fail("cannot read attribute '" + name + "'");
  return v;
}

std::string File::attr_string(hid_t obj, const std::string& name) const {
  Object a = open_attr(obj, name);
  Object type(H5Aget_type(a.id()), H5Tclose);
  if (H5Tget_class(type.id()) != H5T_STRING)
    throw std::runtime_error(path_ + ": attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(type.id()) > 0) {
    // Written by other tools (h5py writes variable-length strings).
    Object mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.id(), H5T_VARIABLE);
    char* s = nullptr;
    if (H5Aread(a.id(), mem.id(), &s) < 0) fail("cannot read attribute '" + name + "'");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.id());
  Object mem = make_string_type(size);
  std::vector<char> buf(size + 1, 0);
  if (H5Aread(a.id(), mem.id(), buf.data()) < 0) fail("cannot read attribute '" + name + "'");
  return std::string(buf.data(), strnlen(buf.data(), size));
}

std::vector<std::pair<std::string, std::string>> File::attrs_as_text(hid_t obj) const {
  // H5Aiterate2 (rather than H5Oget_info*, whose signature changed between HDF5 1.10 and
  // 1.12) collects the names; each is then read by type.
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names) < 0) fail("cannot list attributes");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& name : names) {
    Object a = open_attr(obj, name);
    Object type(H5Aget_type(a.id()), H5Tclose);
    switch (H5Tget_class(type.id())) {
      case H5T_INTEGER: out.emplace_back(name, std::to_string(attr_int(obj, name))); break;
      case H5T_FLOAT: out.emplace_back(name, format_number(attr_double(obj, name))); break;
      case H5T_STRING: out.emplace_back(name, attr_string(obj, name)); break;
      default: break;  // no other kinds are written
    }
  }
  return out;
}

void File::write_raw(hid_t parent, const std::string& name, hid_t mem, hid_t file, const void* data,
                     const std::vector<hsize_t>& dims) {
  Object space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  if (space.id() < 0) fail("cannot create dataspace for '" + name + "'");
  Object d(H5Dcreate2(parent, name.c_str(), file, space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (d.id() < 0) fail("cannot create dataset '" + name + "'");
  size_t n = 1;
  for (hsize_t x : dims) n *= x;
  if (n > 0 && H5Dwrite(d.id(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail("cannot write dataset '" + name + "'");
}

void File::write_strings(hid_t parent, const std::string& name, const std::vector<std::string>& values) {
  size_t width = 0;
  for (const auto& s : values) width = std::max(width, s.size());
  Object type = make_string_type(width);
  std::vector<char> buf(values.size() * (width + 1), '\0');
  for (size_t i = 0; i < values.size(); ++i) std::memcpy(&buf[i * (width + 1)], values[i].data(), values[i].size());
  const hsize_t n = values.size();
  Object space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Object d(H5Dcreate2(parent, name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (d.id() < 0) fail("cannot create dataset '" + name + "'");
  if (n > 0 && H5Dwrite(d.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
    fail("cannot write dataset '" + name + "'");
}

Object File::open_dataset(hid_t parent, const std::string& name) const {
  if (!has(parent, name)) throw std::runtime_error(path_ + ": dataset '" + name + "' is missing");
  hid_t d = H5Dopen2(parent, name.c_str(), H5P_DEFAULT);
  if (d < 0) fail("cannot open dataset '" + name + "'");
  return Object(d, H5Dclose);
}

std::vector<hsize_t> File::dims(hid_t parent, const std::string& name) const {
  Object d = open_dataset(parent, name);
  Object space(H5Dget_space(d.id()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0) fail("cannot read the shape of '" + name + "'");
  std::vector<hsize_t> out(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.id(), out.data(), nullptr);
  return out;
}

bool File::is_string_dataset(hid_t parent, const std::string& name) const {
  Object d = open_dataset(parent, name);
  Object type(H5Dget_type(d.id()), H5Tclose);
  return H5Tget_class(type.id()) == H5T_STRING;
}

void File::read_raw(hid_t parent, const std::string& name, hid_t mem, void* dst, size_t count) const {
  Object d = open_dataset(parent, name);
  Object space(H5Dget_space(d.id()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  if (n < 0) fail("cannot read the size of '" + name + "'");
  if (static_cast<size_t>(n) != count)
    throw std::runtime_error(path_ + ": dataset '" + name + "' has " + std::to_string(n) + " values, expected " +
                             std::to_string(count));
  if (count > 0 && H5Dread(d.id(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
    fail("cannot read dataset '" + name + "' (truncated or corrupt file?)");
}

std::vector<std::string> File::read_strings(hid_t parent, const std::string& name) const {
  Object d = open_dataset(parent, name);
  Object type(H5Dget_type(d.id()), H5Tclose);
  if (H5Tget_class(type.id()) != H5T_STRING || H5Tis_variable_str(type.id()) > 0)
    throw std::runtime_error(path_ + ": dataset '" + name + "' is not a fixed-length string dataset");
  Object space(H5Dget_space(d.id()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  const size_t width = H5Tget_size(type.id());
  Object mem = make_string_type(width);  // one more byte per value than stored: always terminated
  std::vector<char> buf(static_cast<size_t>(n) * (width + 1), '\0');
  if (n > 0 && H5Dread(d.id(), mem.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
    fail("cannot read dataset '" + name + "'");
  std::vector<std::string> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {
    const char* s = &buf[i * (width + 1)];
    out[i].assign(s, strnlen(s, width + 1));
  }
  return out;
}

}  // namespace seqrec::io::h5
