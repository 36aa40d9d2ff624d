#pragma once
// Removes a directory tree (or a file) with POSIX calls. std::filesystem::remove_all is not
// used: PyTorch wheels' libtorch.so exports a private copy of std::filesystem whose remove_all
// crashes (pytorch/pytorch#133437), and where a toolchain binds the call to that copy despite
// the link order (CMakeLists.txt) every run that prunes a checkpoint would die. Header-only so
// that the tests' scratch directories use it too.
#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <sys/stat.h>

namespace seqrec::io {

namespace detail {
inline int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
}  // namespace detail

// "" when `path` is gone (or never existed), else what failed. Symbolic links are removed,
// never followed.
inline std::string try_remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : path + ": " + std::strerror(errno);
  if (::nftw(path.c_str(), detail::remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    return "cannot remove " + path + ": " + std::strerror(errno);
  return "";
}

// Throws std::runtime_error naming the path and the reason.
inline void remove_tree(const std::string& path) {
  const std::string error = try_remove_tree(path);
  if (!error.empty()) throw std::runtime_error(error);
}

}  // namespace seqrec::io
