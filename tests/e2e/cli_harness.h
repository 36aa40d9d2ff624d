#pragma once
// Runs the seqrec CLI (or mpirun) as a child process with a hard time limit, so a hang fails
// the test instead of stalling the suite.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "io/remove_tree.h"
#include "tests/test_files.h"

namespace seqrec::testing {

struct RunResult {
  int code = -1;       // exit status; 124/137 when the time limit killed it
  std::string output;  // stdout + stderr
};

inline std::string seqrec_bin() {
  const char* b = std::getenv("SEQREC_BIN");
  return b ? b : "seqrec";
}

inline std::string mpirun() { return "mpirun --allow-run-as-root --oversubscribe -x OMP_WAIT_POLICY=PASSIVE"; }

inline RunResult run_command(const std::string& command, int timeout_s = 60) {
  const std::string full = "timeout -k 5 " + std::to_string(timeout_s) + " " + command + " 2>&1";
  RunResult r;
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline RunResult run_seqrec(const std::string& args, int timeout_s = 60) {
  return run_command(seqrec_bin() + " " + args, timeout_s);
}

// A fresh scratch directory per test under the build tree's temp area.
inline std::string scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("seqrec-test-" + name + "-" + std::to_string(::getpid()));
  seqrec::io::remove_tree(dir.string());
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The git revision `seqrec --version` names ("seqrec REV (LibTorch ...)"), or "" if it names none.
inline std::string revision_of(const std::string& bin) {
  const RunResult r = run_command(bin + " --version");
  if (r.code != 0 || r.output.rfind("seqrec ", 0) != 0) return "";
  return r.output.substr(7, r.output.find(" (") - 7);
}

// A copy of the seqrec executable at `path` that names another build: the revision behind the
// marker launcher/revision.cpp puts in the binary is overwritten, byte for byte, with as many 'f's
// (so the copy runs the same code and calls itself a different revision). Returns that
// revision, or "" with `why` set when the executable has no marked revision.
inline std::string copy_as_another_build(const std::string& path, std::string* why) {
  const std::string rev = revision_of(seqrec_bin());
  std::string bytes = read_file(seqrec_bin());
  if (bytes.empty()) return *why = "cannot read " + seqrec_bin(), "";
  const std::string marked = "seqrec-revision:" + rev;
  const auto at = bytes.find(marked + '\0');
  if (rev.empty() || at == std::string::npos) return *why = "no marked revision in " + seqrec_bin(), "";
  const std::string other(rev.size(), 'f');
  bytes.replace(at + marked.size() - rev.size(), rev.size(), other);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  const bool written = f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f) std::fclose(f);
  if (!written) return *why = "cannot write " + path, "";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return other;
}

}  // namespace seqrec::testing
