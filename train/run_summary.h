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

// The progress line's durations: format_duration writes seconds as "6h43m", "27m04s" or "9s"
// ("?" for a negative or non-finite figure), parse_duration reads that form back (-1 for "?" or
// anything else).
std::string format_duration(double seconds);
double parse_duration(const std::string& text);

// True when `dir` holds a run (train.log or metrics.jsonl).
bool is_run_directory(const std::string& dir);

// The summary text. Throws std::runtime_error naming the file and line when metrics.jsonl is
// malformed.
std::string describe_run(const std::string& dir);

// Two or more runs side by side (`seqrec info RUN RUN...`): per run its model, seed, status,
// selected epoch and valid selection figure, and `metrics` of its last test evaluation under every
// protocol any of the runs was tested with (numbered, listed above the table). Runs whose
// flags.txt agree on everything but the seed and how they were executed (threads, output,
// resume, logging) are grouped, with the mean and sample standard deviation of each figure over
// the group's finished runs. Two groups with at least two finished seeds in common are compared
// seed by seed (a seed fixes the data order, negatives and candidates, so the pairs share them):
// the later group minus the earlier, the mean and sample standard deviation of the per-seed
// differences of each figure and the 95% Student-t interval of the mean difference. A flag that
// a run's flags.txt lacks (written before the flag existed) is taken at its value in `defaults`
// (flag -> default, as the binary defines it); without one it is not compared. Throws
// std::invalid_argument for fewer than two directories, no metric, or a directory that is not a
// run.
std::string compare_runs(const std::vector<std::string>& dirs, const std::vector<std::string>& metrics,
                         const std::map<std::string, std::string>& defaults = {});

// The runs' validation curves side by side (`seqrec info RUN... --curves`): one row per epoch
// any of them validated, one column per run with its selection metric under its selection
// protocol there ("-" where it did not validate; "*" at its selected epoch so far), a last row
// with each run's best and its epoch, and for two runs of one selection figure their difference
// ([2] - [1]) at each epoch both validated: the equal-epoch comparison of two settings. Throws
// std::invalid_argument for no directory or one that is not a run.
std::string compare_curves(const std::vector<std::string>& dirs);

}  // namespace seqrec::train
