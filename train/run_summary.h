#pragma once
// A run directory's results in a few lines (`seqrec info RUN`): where training stands, the model
// selected on validation, the test evaluation of that model with its protocols, the training time
// per epoch and the peak memory. Read from what the trainer writes: train.log, metrics.jsonl and
// flags.txt. Nothing here needs Torch.
#include <map>
#include <string>
#include <vector>

namespace seqrec::train {

// One line of metrics.jsonl: its string fields (dataset, split, protocol, candidates, tie) and
// its numbers (epoch, step, users, seconds and the metrics).
struct MetricsRecord {
  std::map<std::string, std::string> text;
  std::map<std::string, double> numbers;
};

// Parses one flat JSON object as result_json writes it (string and number values). Throws
// std::invalid_argument naming what is wrong.
MetricsRecord parse_metrics_line(const std::string& line);

// True when `dir` holds a run (train.log or metrics.jsonl).
bool is_run_directory(const std::string& dir);

// The summary text. Throws std::runtime_error naming the file and line when metrics.jsonl is
// malformed.
std::string describe_run(const std::string& dir);

}  // namespace seqrec::train
