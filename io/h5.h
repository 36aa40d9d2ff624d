#pragma once
// Thin RAII layer over the serial HDF5 C API, private to io/. Every failure becomes a
// std::runtime_error naming the file, what was being done and HDF5's own reason; HDF5's
// automatic error printing is switched off so nothing else reaches stderr.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace seqrec::io::h5 {

// Switches off HDF5's error-stack printing (once per process).
void init();

[[noreturn]] void fail(const std::string& file, const std::string& what);

// Owns one hid_t and closes it with the matching H5?close.
class Object {
 public:
  using Closer = herr_t (*)(hid_t);
  Object() = default;
  Object(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Object() { reset(); }
  Object(Object&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Object& operator=(Object&& o) noexcept;
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  hid_t id() const { return id_; }
  void reset();
  // Gives up ownership without closing.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

template <typename T>
struct Type;
template <>
struct Type<int32_t> {
  static hid_t mem() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
};
template <>
struct Type<int64_t> {
  static hid_t mem() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
};
template <>
struct Type<uint32_t> {
  static hid_t mem() { return H5T_NATIVE_UINT32; }
  static hid_t file() { return H5T_STD_U32LE; }
};
template <>
struct Type<double> {
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
  static hid_t file() { return H5T_IEEE_F64LE; }
};

class File {
 public:
  // Creates a new file; fails if it exists.
  static File create(const std::string& path);
  // Opens read-only after checking that the file exists and is HDF5 at all, so that the
  // message says "missing" or "not an HDF5 file" rather than HDF5's generic failure.
  static File open(const std::string& path, const std::string& missing_hint = "");

  const std::string& path() const { return path_; }
  hid_t root() const { return file_.id(); }
  // Flushes and closes, reporting failures (the destructor cannot).
  void close();

  Object create_group(const std::string& name);
  bool has(hid_t parent, const std::string& name) const;
  Object open_group(const std::string& name) const;

  void set_attr(hid_t obj, const std::string& name, int64_t value);
  void set_attr(hid_t obj, const std::string& name, double value);
  void set_attr(hid_t obj, const std::string& name, const std::string& value);
  bool has_attr(hid_t obj, const std::string& name) const;
  int64_t attr_int(hid_t obj, const std::string& name) const;
  double attr_double(hid_t obj, const std::string& name) const;
  std::string attr_string(hid_t obj, const std::string& name) const;
  // Every attribute of obj, numbers formatted as text.
  std::vector<std::pair<std::string, std::string>> attrs_as_text(hid_t obj) const;

  // Contiguous, uncompressed datasets: one read at disk speed, and a flipped bit lands in
  // the values where the shard checksum sees it.
  template <typename T>
  void write(hid_t parent, const std::string& name, const T* data, const std::vector<hsize_t>& dims) {
    write_raw(parent, name, Type<T>::mem(), Type<T>::file(), data, dims);
  }
  template <typename T>
  void write(hid_t parent, const std::string& name, const std::vector<T>& v) {
    write(parent, name, v.data(), {static_cast<hsize_t>(v.size())});
  }
  void write_strings(hid_t parent, const std::string& name, const std::vector<std::string>& values);

  std::vector<hsize_t> dims(hid_t parent, const std::string& name) const;
  bool is_string_dataset(hid_t parent, const std::string& name) const;
  // Reads the whole dataset into dst, which must hold exactly `count` elements.
  template <typename T>
  void read(hid_t parent, const std::string& name, T* dst, size_t count) const {
    read_raw(parent, name, Type<T>::mem(), dst, count);
  }
  template <typename T>
  std::vector<T> read(hid_t parent, const std::string& name) const {
    size_t n = 1;
    for (hsize_t d : dims(parent, name)) n *= d;
    std::vector<T> v(n);
    read(parent, name, v.data(), n);
    return v;
  }
  std::vector<std::string> read_strings(hid_t parent, const std::string& name) const;

 private:
  File(std::string path, Object file) : path_(std::move(path)), file_(std::move(file)) {}
  void write_raw(hid_t parent, const std::string& name, hid_t mem, hid_t file, const void* data,
                 const std::vector<hsize_t>& dims);
  void read_raw(hid_t parent, const std::string& name, hid_t mem, void* dst, size_t count) const;
  Object open_dataset(hid_t parent, const std::string& name) const;
  Object open_attr(hid_t obj, const std::string& name) const;
  [[noreturn]] void fail(const std::string& what) const { h5::fail(path_, what); }

  std::string path_;
  Object file_;
};

}  // namespace seqrec::io::h5
