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

}  // namespace seqrec::testing
