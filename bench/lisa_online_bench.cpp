// LISA's online inference (§4.8): time per pushed item at a given history length. The state is
// the decayed codeword histogram, so the per-step time must not grow with the history.
//   lisa_online_bench [--history 64,8192] [--steps 256] [--dim 128] [--codebooks 8] [--codewords 32]
// Prints one JSON line per history length: history, us_per_step (mean over the last `steps`
// pushes after `history` pushes).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"

int main(int argc, char** argv) {
  std::vector<int64_t> histories = {64, 8192};
  int64_t steps = 256, dim = 128, books = 8, words = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--history") {
      histories.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) histories.push_back(std::atoll(x.c_str()));
    } else if (a == "--steps") steps = std::atoll(v.c_str());
    else if (a == "--dim") dim = std::atoll(v.c_str());
    else if (a == "--codebooks") books = std::atoll(v.c_str());
    else if (a == "--codewords") words = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "lisa_online_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  seqrec::models::ModelOptions o;
  o.model = "lisa";
  o.num_items = 3416;
  o.max_len = 200;
  o.hidden = dim;
  o.blocks = 1;
  o.heads = 1;
  o.codebooks = books;
  o.codewords = words;
  o.norm_first = false;
  auto model = seqrec::models::make_model(o);
  model->set_training(false);
  for (int64_t history : histories) {
    auto session = model->online_session();
    for (int64_t t = 0; t < history; ++t) session->push(1 + (t * 7919) % o.num_items);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < steps; ++t) session->push(1 + ((history + t) * 7919) % o.num_items);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps;
    std::printf("{\"history\":%lld,\"us_per_step\":%.1f,\"dim\":%lld,\"codebooks\":%lld,\"codewords\":%lld,\"threads\":%d}\n",
                static_cast<long long>(history), us, static_cast<long long>(dim), static_cast<long long>(books),
                static_cast<long long>(words), at::get_num_threads());
  }
  return 0;
}
