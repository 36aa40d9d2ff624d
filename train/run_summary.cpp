#include "train/run_summary.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "models/model.h"
#include "train/run_lock.h"

namespace seqrec::train {
namespace {

namespace fs = std::filesystem;

class JsonCursor {
 public:
  explicit JsonCursor(const std::string& s) : s_(s) {}

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool at_end() {
    skip_space();
    return i_ >= s_.size();
  }
  bool consume(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  char peek() {
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end of line");
    return s_[i_];
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      const char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("a truncated \\u escape");
          const unsigned code = static_cast<unsigned>(std::stoul(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: out += e;  // \" \\ \/
      }
    }
    if (i_ >= s_.size()) fail("an unterminated string");
    ++i_;
    return out;
  }
  double number() {
    skip_space();
    const size_t begin = i_;
    while (i_ < s_.size() && std::string("+-0123456789.eE").find(s_[i_]) != std::string::npos) ++i_;
    if (begin == i_) fail("expected a string or a number");
    try {
      size_t used = 0;
      const double v = std::stod(s_.substr(begin, i_ - begin), &used);
      if (used != i_ - begin) fail("a malformed number");
      return v;
    } catch (const std::logic_error&) {
      fail("a malformed number");
    }
    return 0;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(what + " at column " + std::to_string(i_ + 1));
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
};

// The text after `key` up to the next space (or the end), or "" when `key` is absent.
std::string field_after(const std::string& line, const std::string& key) {
  const auto at = line.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  return line.substr(begin, line.find(' ', begin) - begin);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// v with `digits` decimals; with `sign`, a plus before a positive figure too (differences).
std::string fixed(double v, int digits, bool sign = false) {
  char buf[64];
  std::snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", digits, v);
  return buf;
}

// The mean and sample standard deviation of two or more figures.
struct Spread {
  double mean = 0, sd = 0;
};
Spread spread(const std::vector<double>& xs) {
  Spread s;
  for (double x : xs) s.mean += x;
  s.mean /= static_cast<double>(xs.size());
  double ss = 0;
  for (double x : xs) ss += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(ss / static_cast<double>(xs.size() - 1));
  return s;
}

// The 0.975 quantile of Student's t distribution with `df` >= 1 degrees of freedom: the table to
// 30, then the Cornish-Fisher expansion about the normal quantile (error below 1e-3 there).
double student_t975(int64_t df) {
  static const double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                  2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) throw std::invalid_argument("student_t975: degrees of freedom must be >= 1");
  if (df <= 30) return kTable[df - 1];
  const double z = 1.959964, n = static_cast<double>(df);
  return z + (z * z * z + z) / (4 * n) + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * n * n);
}

// The numbers of a metrics record that say where and how long, not how well.
bool is_bookkeeping(const std::string& name) {
  return name == "epoch" || name == "step" || name == "users" || name == "seconds";
}

// "HR@5=... HR@10=... NDCG@10=... MRR=..." in a fixed order, then any other metric; tied last.
std::string format_metrics(const MetricsRecord& r) {
  std::vector<std::string> names;
  for (const auto& [name, v] : r.numbers)
    if (!is_bookkeeping(name) && name != "tied") names.push_back(name);
  const auto rank = [](const std::string& name) {
    const auto at = name.find('@');
    const std::string family = name.substr(0, at);
    const int k = at == std::string::npos ? 1000 : std::atoi(name.c_str() + at + 1);
    const int f = family == "HR" ? 0 : family == "NDCG" ? 1 : family == "MRR" ? 2 : 3;
    return std::make_pair(f, k);
  };
  std::sort(names.begin(), names.end(),
            [&](const std::string& a, const std::string& b) { return rank(a) < rank(b) || (rank(a) == rank(b) && a < b); });
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : " ") + name + "=" + fixed(r.numbers.at(name), 4);
  if (r.numbers.count("tied")) out += " tied=" + fixed(r.numbers.at("tied"), 4);
  return out;
}

std::string protocol_line(const MetricsRecord& r) {
  const auto text = [&](const char* k) { return r.text.count(k) ? r.text.at(k) : std::string("?"); };
  std::string users = r.numbers.count("users") ? std::to_string(static_cast<long long>(r.numbers.at("users"))) : "?";
  return "    \"" + text("candidates") + "\" (tie=" + text("tie") + ", users=" + users + "): " + format_metrics(r) + "\n";
}

}  // namespace

MetricsRecord parse_metrics_line(const std::string& line) {
  MetricsRecord r;
  JsonCursor c(line);
  c.expect('{');
  if (!c.consume('}')) {
    do {
      const std::string key = c.string();
      c.expect(':');
      if (c.peek() == '"')
        r.text[key] = c.string();
      else
        r.numbers[key] = c.number();
    } while (c.consume(','));
    c.expect('}');
  }
  if (!c.at_end()) c.fail("text after the object");
  return r;
}

bool is_run_directory(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "train.log") || fs::is_regular_file(fs::path(dir) / "metrics.jsonl");
}

namespace {

// Everything a run directory says about itself: metrics.jsonl's records, the facts train.log
// states in words, and flags.txt. Read once; describe_run and compare_runs format it.
struct RunFacts {
  std::string dir, model, dataset, select_metric, select_candidates, last_select, test_line, stop_line, error_line,
      done_time, device, machine, done_machine;  // machine: the sitting's; done_machine: the last finished one's
  int64_t sittings = 0, last_epoch = -1, epochs = -1, last_step = -1, selected_epoch = -1;
  int64_t steps_per_epoch = -1;  // the last sitting's, from its "[setup] model=" line
  double eta_seconds = -1;       // the last progress line's time to the planned epochs, at its sitting's pace
  double log_age_seconds = -1;   // since train.log was last written
  double peak_rss = -1, peak_gpu = -1;  // peak_gpu: --device cuda sittings only
  std::vector<MetricsRecord> records;
  std::vector<std::string> builds;           // per sitting, its "[setup] build:" ("" where not logged)
  std::map<std::string, std::string> flags;  // flags.txt: name -> value, as the trainer wrote it
  RunLockHolder lock;                         // who holds the run's .lock now

  // A flag as flags.txt records it, or `fallback` where it does not.
  std::string flag(const std::string& name, const std::string& fallback) const {
    const auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
  bool is(const MetricsRecord& r, const char* split) const { return r.text.count("split") && r.text.at("split") == split; }
  static int64_t number(const MetricsRecord& r, const char* key) {
    return r.numbers.count(key) ? static_cast<int64_t>(r.numbers.at(key)) : -1;
  }

  // The test evaluations at the last step the test split was evaluated at (the trainer evaluates
  // it once, at the end, one record per protocol), and how many evaluations there were in all.
  std::vector<const MetricsRecord*> final_tests(int64_t* evaluations = nullptr) const {
    std::vector<const MetricsRecord*> tests;
    for (const auto& r : records)
      if (is(r, "test")) tests.push_back(&r);
    int64_t n = 0, prev_step = -1;
    for (const auto* r : tests) {
      if (number(*r, "step") != prev_step || n == 0) ++n;
      prev_step = number(*r, "step");
    }
    if (evaluations) *evaluations = n;
    std::vector<const MetricsRecord*> last;
    for (const auto* r : tests)
      if (number(*r, "step") == prev_step) last.push_back(r);
    return last;
  }

  // The valid record of the selected epoch under the selection protocol, or null.
  const MetricsRecord* selected_valid() const {
    const MetricsRecord* found = nullptr;
    for (const auto& r : records)
      if (is(r, "valid") && number(r, "epoch") == selected_epoch && selected_epoch >= 0 &&
          r.text.count("candidates") && r.text.at("candidates") == select_candidates && r.numbers.count(select_metric))
        found = &r;
    return found;
  }

  // The selection metric at every validation under the selection protocol, by epoch (the last
  // record of an epoch that was validated twice, as after a resume from an earlier checkpoint).
  std::map<int64_t, double> valid_curve() const {
    std::map<int64_t, double> curve;
    if (select_metric.empty()) return curve;
    for (const auto& r : records)
      if (is(r, "valid") && r.numbers.count("epoch") && r.numbers.count(select_metric) && r.text.count("candidates") &&
          r.text.at("candidates") == select_candidates)
        curve[number(r, "epoch")] = r.numbers.at(select_metric);
    return curve;
  }

  bool tested() const { return !test_line.empty(); }
  // Tested, with its last progress line in the last epoch it planned: a run that --patience did
  // not stop short (one it stopped at its last epoch would have stopped there anyway).
  bool trained_every_epoch() const { return tested() && epochs > 0 && last_epoch == epochs; }
  // Neither failed, tested nor stopped by its log: training, or interrupted.
  bool unfinished() const { return error_line.empty() && !tested() && stop_line.empty(); }

  // running (a trainer on this machine holds the run's lock: whatever its log said before),
  // failed, finished, stopped, or unfinished: interrupted where the lock is free, in progress or
  // interrupted where the lock table cannot tell; with the reason, or in one word.
  std::string status(bool with_reason) const {
    if (lock.state == RunLockHolder::State::kHeld)
      return with_reason ? "in progress (pid " + std::to_string(lock.pid) + " on this machine holds the run's lock)"
                         : "running";
    if (!error_line.empty()) return with_reason ? "failed (" + error_line + ")" : "failed";
    if (unfinished()) {
      if (!with_reason) return "unfinished";
      return lock.state == RunLockHolder::State::kFree
                 ? "interrupted (no test evaluation, and no trainer on this machine holds the run's lock: "
                   "continue it with --resume auto)"
                 : "in progress or interrupted (no test evaluation yet)";
    }
    const std::string word = tested() ? "finished" : "stopped";
    return with_reason && !stop_line.empty() ? word + " (" + stop_line + ")" : word;
  }
};

RunFacts read_run(const std::string& dir) {
  RunFacts f;
  f.dir = dir;
  // metrics.jsonl: every evaluation, in order (a resumed run appends).
  {
    std::ifstream in(fs::path(dir) / "metrics.jsonl");
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        f.records.push_back(parse_metrics_line(line));
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error((fs::path(dir) / "metrics.jsonl").string() + " line " + std::to_string(n) +
                                 ": not a metrics record (" + e.what() + ")");
      }
    }
  }
  // train.log: the facts the trainer states in words. A sitting starts at each "[setup] dataset=".
  {
    std::ifstream in(fs::path(dir) / "train.log");
    std::string line;
    bool error_continues = false;
    while (std::getline(in, line)) {
      if (!starts_with(line, "[error] ")) error_continues = false;
      if (starts_with(line, "[setup] dataset=")) {
        ++f.sittings;
        f.builds.emplace_back();
        f.machine.clear();
        f.eta_seconds = -1;  // a new sitting has its own pace
        f.dataset = field_after(line, "dataset=");
        f.device = field_after(line, " device=");  // absent in logs of older binaries: the CPU
        f.stop_line.clear();
        f.error_line.clear();
      } else if (starts_with(line, "[setup] machine: ")) {
        f.machine = line.substr(17);
      } else if (starts_with(line, "[setup] build: ") && !f.builds.empty()) {
        f.builds.back() = line.substr(15);
      } else if (starts_with(line, "[setup] model=")) {
        f.model = field_after(line, "model=");
        const std::string spe = field_after(line, " steps/epoch=");
        if (!spe.empty()) f.steps_per_epoch = std::atoll(spe.c_str());
      } else if (starts_with(line, "[setup] model selection: valid ")) {
        const auto under = line.find(" under \"");
        f.select_metric = line.substr(31, under == std::string::npos ? std::string::npos : under - 31);
        if (under != std::string::npos) {
          f.select_candidates = line.substr(under + 8);
          if (!f.select_candidates.empty() && f.select_candidates.back() == '"') f.select_candidates.pop_back();
        }
      } else if (starts_with(line, "[select] new best valid ")) {
        f.last_select = line.substr(24);
        f.selected_epoch = std::atoll(field_after(line, " at epoch ").c_str());
      } else if (starts_with(line, "[train] epoch ")) {
        const std::string e = field_after(line, "[train] epoch ");
        f.last_epoch = std::atoll(e.c_str());
        if (const auto slash = e.find('/'); slash != std::string::npos) f.epochs = std::atoll(e.c_str() + slash + 1);
        f.last_step = std::atoll(field_after(line, " step ").c_str());
        f.eta_seconds = parse_duration(field_after(line, " ETA(epochs) "));
      } else if (starts_with(line, "[stop] ")) {
        f.stop_line = line.substr(7);
      } else if (starts_with(line, "[error] ")) {
        // One error may take several lines (each prefixed), joined here; a later one replaces it.
        std::string part = line.substr(8);
        part.erase(0, part.find_first_not_of(" \t"));
        if (error_continues && !f.error_line.empty())
          f.error_line += (f.error_line.back() == ':' ? " " : "; ") + part;
        else
          f.error_line = part;
        error_continues = true;
        continue;
      } else if (starts_with(line, "[done] steps=")) {
        f.last_step = std::atoll(field_after(line, "steps=").c_str());
        f.done_time = field_after(line, "train time/epoch=");
        f.done_machine = f.machine;
        f.peak_rss = std::max(f.peak_rss, std::atof(field_after(line, "peak RSS/rank=").c_str()));
        const std::string gpu = field_after(line, "peak GPU memory allocated=");
        if (!gpu.empty()) f.peak_gpu = std::max(f.peak_gpu, std::atof(gpu.c_str()));
      } else if (starts_with(line, "[test] ")) {
        f.test_line = line.substr(7);
      }
    }
  }
  {
    std::ifstream in(fs::path(dir) / "flags.txt");
    std::string line;
    while (std::getline(in, line)) {  // --name=value (name=value before 2026-12-06), # comments
      if (starts_with(line, "#")) continue;
      if (starts_with(line, "--")) line.erase(0, 2);
      const auto eq = line.find('=');
      if (eq != std::string::npos) f.flags[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  if (f.model.empty()) f.model = f.flag("model", "");
  for (const auto& r : f.records)
    if (r.text.count("dataset")) f.dataset = r.text.at("dataset");
  f.lock = run_lock_holder(dir);
  std::error_code ec;
  const auto written = fs::last_write_time(fs::path(dir) / "train.log", ec);
  if (!ec)
    f.log_age_seconds = std::chrono::duration<double>(fs::file_time_type::clock::now() - written).count();
  return f;
}

// Which builds trained the run, sitting by sitting: one line naming the build where every sitting
// logged the same, the sittings grouped by build where they differ (a run resumed by newer code),
// nothing where no sitting logged one (binaries before 2026-12-06).
std::string builds_line(const std::vector<std::string>& builds) {
  if (std::all_of(builds.begin(), builds.end(), [](const std::string& b) { return b.empty(); })) return "";
  if (std::all_of(builds.begin(), builds.end(), [&](const std::string& b) { return b == builds.front(); }))
    return "  build: " + builds.front() + "\n";
  std::string out = "  builds:";
  for (size_t i = 0; i < builds.size();) {
    size_t j = i;
    while (j + 1 < builds.size() && builds[j + 1] == builds[i]) ++j;
    out += (i ? "; " : " ") + std::string(i == j ? "sitting " : "sittings ") + std::to_string(i + 1) +
           (i == j ? "" : "-" + std::to_string(j + 1)) + ": " + (builds[i].empty() ? "not recorded" : builds[i]);
    i = j + 1;
  }
  return out + "\n";
}

// Rows of cells as aligned text, each column as wide as its widest cell, two spaces between
// columns: left-aligned (the last column unpadded) or right-aligned (trailing blanks dropped).
std::string aligned_table(const std::vector<std::vector<std::string>>& rows, bool right) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& cells : rows) {
    std::string s;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (right)
        s += std::string(c ? 2 : 0, ' ') + pad + cells[c];
      else
        s += cells[c] + (c + 1 < cells.size() ? pad + "  " : "");
    }
    if (right) s.erase(s.find_last_not_of(' ') + 1);
    out += s + "\n";
  }
  return out;
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  return buf;
}

double parse_duration(const std::string& text) {
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i || j == text.size()) return -1;
    const double n = std::atof(text.substr(i, j - i).c_str());
    const char unit = text[j];
    if (unit == 'h') total += 3600 * n;
    else if (unit == 'm') total += 60 * n;
    else if (unit == 's') total += n;
    else return -1;
    any = true;
    i = j + 1;
  }
  return any ? total : -1;
}

std::string describe_run(const std::string& dir) {
  const RunFacts f = read_run(dir);
  std::ostringstream out;
  out << "run: " << dir << "\n";
  out << "  model: " << (f.model.empty() ? "?" : f.model) << ", dataset: " << (f.dataset.empty() ? "?" : f.dataset)
      << ", sittings: " << f.sittings << "\n";
  out << builds_line(f.builds);
  int64_t last_valid = -1, validations = 0;
  for (const auto& r : f.records)
    if (f.is(r, "valid") && r.numbers.count("epoch")) {
      if (RunFacts::number(r, "epoch") != last_valid) ++validations;
      last_valid = RunFacts::number(r, "epoch");
    }
  out << "  trained: ";
  if (f.last_step >= 0)
    out << f.last_step << " steps"
        << (f.last_epoch >= 0 ? " (the last progress line in epoch " + std::to_string(f.last_epoch) +
                                    (f.epochs > 0 ? " of " + std::to_string(f.epochs) : "") + ")"
                              : "");
  else
    out << "no training step logged";
  out << "; " << validations << " validation(s)" << (last_valid >= 0 ? ", the last at epoch " + std::to_string(last_valid) : "")
      << "\n";
  out << "  status: " << f.status(true) << "\n";

  // The selection metric at every validation under the selection protocol.
  int64_t stop_at = -1;  // where patience would stop an unfinished run, if no validation improves
  if (!f.select_metric.empty()) {
    const std::map<int64_t, double> curve = f.valid_curve();
    if (!curve.empty()) {
      out << "  valid " << f.select_metric << " by epoch:";
      for (const auto& [epoch, v] : curve) out << " " << epoch << ":" << fixed(v, 4);
      out << "\n";
    }
    // An unfinished run under --patience: how far it is from stopping, and where it would stop
    // if no validation improves (validations fall on multiples of --eval_every).
    const int64_t patience = std::atoll(f.flag("patience", "0").c_str());
    const int64_t every = std::atoll(f.flag("eval_every", "1").c_str());
    if (patience > 0 && every > 0 && f.unfinished() && f.selected_epoch >= 0 && !curve.empty()) {
      int64_t since = 0;
      for (const auto& [epoch, v] : curve) since += epoch > f.selected_epoch;
      stop_at = curve.rbegin()->first + std::max<int64_t>(patience - since, 0) * every;
      out << "  patience: " << since << " of " << patience << " validation(s) since the best (epoch " << f.selected_epoch
          << ") without a new best; ";
      if (f.epochs > 0 && stop_at >= f.epochs)
        out << "it runs to its planned last epoch, " << f.epochs << "\n";
      else
        out << "unless one improves, it stops after validating epoch " << stop_at
            << (f.epochs > 0 ? " (planned: " + std::to_string(f.epochs) + ")" : "") << "\n";
    }
  }
  // A run a trainer is running now: how long it has left at its sitting's pace, as the last
  // progress line put it (with that line's age: the log is written only every --log_every
  // steps), and how long to where patience would stop it.
  if (f.lock.state == RunLockHolder::State::kHeld && f.unfinished() && f.eta_seconds >= 0) {
    out << "  time left: about " << format_duration(f.eta_seconds) << " to the planned last epoch";
    const double planned_left = static_cast<double>(f.epochs * f.steps_per_epoch - f.last_step);
    if (stop_at > 0 && stop_at < f.epochs && f.steps_per_epoch > 0 && f.last_step >= 0 && planned_left > 0)
      out << ", about "
          << format_duration(f.eta_seconds / planned_left *
                             std::max<double>(0.0, static_cast<double>(stop_at * f.steps_per_epoch - f.last_step)))
          << " to the patience stop after epoch " << stop_at;
    out << " (at this sitting's pace, from the last progress line"
        << (f.log_age_seconds >= 0 ? ", written " + format_duration(std::max(0.0, f.log_age_seconds)) + " ago" : "") << ")\n";
  }

  // The selected model, with every protocol validated at its epoch.
  if (f.selected_epoch >= 0) {
    out << "  selected on valid " << f.select_metric
        << (f.select_candidates.empty() ? "" : " under \"" + f.select_candidates + "\"") << ": " << f.last_select << "\n";
    out << "  valid at the selected epoch:\n";
    for (const auto& r : f.records)
      if (f.is(r, "valid") && RunFacts::number(r, "epoch") == f.selected_epoch) out << protocol_line(r);
  } else {
    out << "  selected: none yet (no validation improved on the start)\n";
  }

  // The test split: the trainer evaluates it once, at the end, with the selected model. More than
  // one test evaluation (a run extended after it finished) is said, not hidden.
  int64_t evaluations = 0;
  const auto tests = f.final_tests(&evaluations);
  if (!tests.empty()) {
    out << "  test (" << (f.test_line.empty() ? "" : f.test_line + "; ") << "epoch " << RunFacts::number(*tests.back(), "epoch");
    if (evaluations > 1) out << "; WARNING: the test split was evaluated " << evaluations << " times, the last shown";
    out << "):\n";
    for (const auto* r : tests) out << protocol_line(*r);
  }
  if (!f.done_time.empty())
    out << "  time: " << f.done_time << " s/epoch training (the last finished sitting"
        << (f.device.empty() || f.device == "cpu" ? "" : ", on " + f.device) << "), peak RSS/rank "
        << fixed(f.peak_rss, 0) << " MiB"
        << (f.peak_gpu >= 0 ? ", peak GPU memory allocated " + fixed(f.peak_gpu, 0) + " MiB" : "")
        << " (the largest finished sitting)\n";
  if (!f.done_time.empty() && !f.done_machine.empty())
    out << "  machine (the last finished sitting): " << f.done_machine << "\n";
  return out.str();
}

std::string compare_runs(const std::vector<std::string>& dirs, const std::vector<std::string>& metrics,
                         const std::map<std::string, std::string>& defaults) {
  if (dirs.size() < 2) throw std::invalid_argument("compare_runs: give two or more run directories");
  if (metrics.empty()) throw std::invalid_argument("compare_runs: name at least one metric (e.g. NDCG@10)");
  std::vector<RunFacts> runs;
  for (const auto& d : dirs) {
    if (!is_run_directory(d)) throw std::invalid_argument("'" + d + "' is not a run directory (no train.log or metrics.jsonl)");
    runs.push_back(read_run(d));
  }
  // A metric no evaluation of any run recorded is a typo, not a missing figure.
  std::set<std::string> recorded;
  for (const auto& f : runs)
    for (const auto& r : f.records)
      for (const auto& [name, v] : r.numbers)
        if (!is_bookkeeping(name)) recorded.insert(name);
  for (const auto& m : metrics)
    if (!recorded.empty() && !recorded.count(m)) {
      std::string list;
      for (const auto& k : recorded) list += (list.empty() ? "" : ", ") + k;
      throw std::invalid_argument("no evaluation of these runs recorded the metric '" + m + "' (they have " + list + ")");
    }
  // The test protocols, numbered in the order they first appear.
  std::vector<std::string> protocols;
  for (const auto& f : runs)
    for (const auto* r : f.final_tests())
      if (r->text.count("candidates") &&
          std::find(protocols.begin(), protocols.end(), r->text.at("candidates")) == protocols.end())
        protocols.push_back(r->text.at("candidates"));
  bool same_selection = true;
  for (const auto& f : runs)
    same_selection = same_selection && f.select_metric == runs[0].select_metric && f.select_candidates == runs[0].select_candidates;

  // Columns: run, model, seed, status, selected epoch, the valid selection figure, then each
  // protocol x metric of the test split. A figure a run does not have is "-".
  std::vector<std::string> head = {"run", "model", "seed", "status", "selected",
                                   same_selection && !runs[0].select_metric.empty() ? "valid " + runs[0].select_metric
                                                                                    : "valid (its selection metric)"};
  for (size_t p = 0; p < protocols.size(); ++p)
    for (const auto& m : metrics) head.push_back("[" + std::to_string(p + 1) + "] " + m);
  // The numbers behind each row, for the means: NaN where a figure is missing.
  const double kMissing = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::vector<double>> values;
  for (const auto& f : runs) {
    int64_t evaluations = 0;
    const auto tests = f.final_tests(&evaluations);
    std::vector<std::string> row = {f.dir, f.model.empty() ? "?" : f.model, f.flag("seed", "?"),
                                    f.status(false) + (evaluations > 1 ? " (test x" + std::to_string(evaluations) + ")" : "")};
    std::vector<double> v;
    const MetricsRecord* sel = f.selected_valid();
    row.push_back(f.selected_epoch >= 0 ? std::to_string(f.selected_epoch) + (f.tested() ? "" : " so far") : "-");
    v.push_back(sel ? sel->numbers.at(f.select_metric) : kMissing);
    row.push_back(sel ? (same_selection ? "" : f.select_metric + " ") + fixed(v.back(), 4) : "-");
    for (const auto& p : protocols)
      for (const auto& m : metrics) {
        const MetricsRecord* t = nullptr;
        for (const auto* r : tests)
          if (r->text.count("candidates") && r->text.at("candidates") == p) t = r;
        const bool has = t && t->numbers.count(m);
        v.push_back(has ? t->numbers.at(m) : kMissing);
        row.push_back(has ? fixed(v.back(), 4) : "-");
      }
    rows.push_back(row);
    values.push_back(v);
  }

  std::ostringstream out;
  out << runs.size() << " runs; test figures are each run's model selected on validation";
  if (same_selection && !runs[0].select_candidates.empty())
    out << " (valid " << runs[0].select_metric << " under \"" << runs[0].select_candidates << "\")";
  out << ", from its last test evaluation\n";
  for (size_t p = 0; p < protocols.size(); ++p) out << "  [" << p + 1 << "] \"" << protocols[p] << "\"\n";
  if (protocols.empty()) out << "  (no run has a test evaluation yet)\n";
  std::vector<std::vector<std::string>> table = {head};
  table.insert(table.end(), rows.begin(), rows.end());
  out << aligned_table(table, false);
  // Runs trained by more than one build: a seed study across builds is worth knowing of (a
  // change between them may have moved the figures). A run resumed by another build counts
  // under each; runs that did not log their build (before 2026-12-06) are not counted.
  std::map<std::string, std::vector<std::string>> by_build;
  for (const auto& f : runs) {
    std::set<std::string> seen;
    for (const auto& b : f.builds)
      if (!b.empty() && seen.insert(b).second) by_build[b].push_back(f.dir);
  }
  if (by_build.size() > 1) {
    out << "trained by " << by_build.size() << " builds (a run resumed by another build under each):\n";
    for (const auto& [build, dirs_of] : by_build) {
      out << "  " << build << ":";
      for (const auto& d : dirs_of) out << " " << d;
      out << "\n";
    }
  }

  // Runs whose flags are equal but for the seed and how the run was executed: the spread over
  // seeds, over the runs that have finished (been tested). A flag one run does not record (an
  // older binary) is taken at its default where `defaults` has it, and not compared otherwise.
  static const std::vector<std::string> kExecution = {
      "seed", "out", "resume", "threads", "device", "fused_kernels", "matmul_precision", "comm", "host_allocator", "flagfile", "log_every", "prefetch",
      "profile_steps", "profile_after", "checkpoint_every", "keep_checkpoints", "eval_batch", "replica_check_every"};
  // A flag's value in run r: as recorded, else its default, else none.
  const auto value = [&](const RunFacts& r, const std::string& k) -> const std::string* {
    if (const auto it = r.flags.find(k); it != r.flags.end()) return &it->second;
    if (const auto it = defaults.find(k); it != defaults.end()) return &it->second;
    return nullptr;
  };
  // The setting flags (not how the run was executed) on which a and b disagree.
  const auto disagreements = [&](const RunFacts& a, const RunFacts& b) {
    std::set<std::string> recorded;
    for (const auto* r : {&a, &b})
      for (const auto& entry : r->flags) recorded.insert(entry.first);
    std::vector<std::string> keys;
    for (const auto& k : recorded) {
      if (std::find(kExecution.begin(), kExecution.end(), k) != kExecution.end()) continue;
      // Selection looks at every validation whatever the patience; the patience only ends a run
      // early, so two runs that both trained every epoch they planned differ by it in nothing.
      if (k == "patience" && a.trained_every_epoch() && b.trained_every_epoch()) continue;
      const std::string *x = value(a, k), *y = value(b, k);
      if (x && y && *x != *y) keys.push_back(k);
    }
    return keys;
  };
  const auto alike = [&](const RunFacts& a, const RunFacts& b) {
    return !a.flags.empty() && !b.flags.empty() && disagreements(a, b).empty();
  };
  // The flags on which some two runs disagree: they name each group, so that two groups of one
  // model tell apart ("flash4rec (flash_unit=mhsa)"), except a model option that another model's
  // run would be labelled with though it does not read it. The model is named anyway.
  std::set<std::string> differing;
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = i + 1; j < runs.size(); ++j)
      for (const auto& k : disagreements(runs[i], runs[j]))
        if (k != "model") differing.insert(k);
  const auto reads = [](const std::string& model, const std::string& key) {
    for (const auto& opt : models::model_option_table())
      if (opt.key == key)
        return opt.models.empty() || std::find(opt.models.begin(), opt.models.end(), model) != opt.models.end();
    return true;  // not a model option: a setting every run has
  };
  // Groups, each its runs in order: a run joins the first group with each of whose runs it is
  // alike, not only its first (likeness is not transitive once a patience that stopped neither of
  // two runs is set aside).
  std::vector<int> group(runs.size(), -1);
  std::vector<std::vector<size_t>> members_of;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (group[i] >= 0) continue;
    group[i] = static_cast<int>(members_of.size());
    members_of.push_back({i});
    for (size_t j = i + 1; j < runs.size(); ++j)
      if (group[j] < 0 && std::all_of(members_of.back().begin(), members_of.back().end(),
                                      [&](size_t m) { return alike(runs[m], runs[j]); })) {
        group[j] = group[i];
        members_of.back().push_back(j);
      }
  }
  const int groups = static_cast<int>(members_of.size());
  // A group's name: its model and the differing flags on which all its members agree (runs alike
  // but for the patience, say, that stopped none of them, keep their patience out of the name).
  const auto label = [&](int g) {
    const RunFacts& f = runs[members_of[g].front()];
    std::string named;
    for (const auto& k : differing) {
      const std::string* v = value(f, k);
      bool agreed = v != nullptr && reads(f.model, k);
      for (size_t i : members_of[g]) {
        const std::string* w = value(runs[i], k);
        agreed = agreed && (!w || *w == *v);  // a flag a run does not record is not compared
      }
      if (agreed) named += (named.empty() ? "" : ", ") + k + "=" + *v;
    }
    return (f.model.empty() ? std::string("?") : f.model) + (named.empty() ? "" : " (" + named + ")");
  };
  bool any = false;
  for (int g = 0; g < groups; ++g) {
    const std::vector<size_t>& members = members_of[g];
    std::vector<size_t> tested;
    std::copy_if(members.begin(), members.end(), std::back_inserter(tested), [&](size_t i) { return runs[i].tested(); });
    if (members.size() < 2) continue;
    if (!any) out << "alike but for the seed (mean +- sample standard deviation over the finished runs):\n";
    any = true;
    std::string seeds;
    for (size_t i : tested) seeds += (seeds.empty() ? "" : ", ") + runs[i].flag("seed", "?");
    out << "  " << label(g) << ", " << members.size() << " runs, " << tested.size() << " finished"
        << (tested.empty() ? "" : " (seeds " + seeds + ")");
    if (tested.size() < 2) {
      out << ": too few finished runs for a spread\n";
      continue;
    }
    out << ":";
    for (size_t c = 0; c < values[0].size(); ++c) {
      std::vector<double> xs;
      for (size_t i : tested)
        if (!std::isnan(values[i][c])) xs.push_back(values[i][c]);
      if (xs.size() < 2) continue;
      const Spread sp = spread(xs);
      out << (c == 0 ? " valid " : "; " + head[c + 5] + " ") << fixed(sp.mean, 4) << " +- " << fixed(sp.sd, 4)
          << (xs.size() < tested.size() ? " (" + std::to_string(xs.size()) + " runs)" : "");
    }
    out << "\n";
  }

  // Two groups with seeds in common: seqrec draws the data order, the negatives and the
  // evaluation candidates from the seed alone, so runs of one seed in two settings are a paired
  // comparison. Per pair of groups (the later given minus the earlier), over the seeds both
  // finished: the mean difference, its sample standard deviation and the 95% Student-t interval
  // of the mean difference. A seed finished twice in one group pairs nothing.
  std::vector<std::map<std::string, size_t>> by_seed(groups);
  std::vector<std::set<std::string>> repeated(groups);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i].tested() || !runs[i].flags.count("seed")) continue;
    const std::string& seed = runs[i].flags.at("seed");
    if (!by_seed[group[i]].emplace(seed, i).second) repeated[group[i]].insert(seed);
  }
  bool paired = false;
  for (int g = 0; g < groups; ++g)
    for (int h = g + 1; h < groups; ++h) {
      std::vector<std::pair<std::string, std::pair<size_t, size_t>>> pairs;  // seed -> (run in g, run in h)
      for (const auto& [seed, i] : by_seed[g]) {
        const auto j = by_seed[h].find(seed);
        if (j != by_seed[h].end() && !repeated[g].count(seed) && !repeated[h].count(seed))
          pairs.push_back({seed, {i, j->second}});
      }
      if (pairs.size() < 2) continue;
      // Seeds in numeric order where they are numbers.
      std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) {
        const long long x = std::atoll(a.first.c_str()), y = std::atoll(b.first.c_str());
        return x != y ? x < y : a.first < b.first;
      });
      if (!paired)
        out << "paired by seed (the later group minus the earlier, over the seeds both finished: mean +- sample "
               "standard deviation of the differences [95% t-interval of the mean difference]):\n";
      paired = true;
      std::string seeds;
      for (const auto& p : pairs) seeds += (seeds.empty() ? "" : ", ") + p.first;
      out << "  " << label(h) << " minus " << label(g) << " (seeds " << seeds << "):";
      bool any_column = false;
      for (size_t c = same_selection ? 0 : 1; c < values[0].size(); ++c) {
        std::vector<double> ds;
        for (const auto& p : pairs) {
          const double a = values[p.second.first][c], b = values[p.second.second][c];
          if (!std::isnan(a) && !std::isnan(b)) ds.push_back(b - a);
        }
        if (ds.size() < 2) continue;
        const Spread sp = spread(ds);
        const double half = student_t975(static_cast<int64_t>(ds.size()) - 1) * sp.sd / std::sqrt(static_cast<double>(ds.size()));
        out << (any_column ? "; " : " ") << (c == 0 ? "valid" : head[c + 5]) << " " << fixed(sp.mean, 4, true) << " +- "
            << fixed(sp.sd, 4) << " [" << fixed(sp.mean - half, 4, true) << ", " << fixed(sp.mean + half, 4, true) << "]"
            << (ds.size() < pairs.size() ? " (" + std::to_string(ds.size()) + " pairs)" : "");
        any_column = true;
      }
      out << (any_column ? "" : " too few pairs with a figure on both sides") << "\n";
    }
  return out.str();
}

std::string compare_curves(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw std::invalid_argument("compare_curves: give one or more run directories");
  std::vector<RunFacts> runs;
  for (const auto& d : dirs) {
    if (!is_run_directory(d)) throw std::invalid_argument("'" + d + "' is not a run directory (no train.log or metrics.jsonl)");
    runs.push_back(read_run(d));
  }
  const auto selection = [](const RunFacts& f) {
    return f.select_metric.empty() ? std::string("no selection metric logged")
                                   : f.select_metric + " under \"" + f.select_candidates + "\"";
  };
  bool same = true;
  for (const auto& f : runs) same = same && selection(f) == selection(runs[0]);
  std::vector<std::map<int64_t, double>> curves;
  std::set<int64_t> epochs;
  for (const auto& f : runs) {
    curves.push_back(f.valid_curve());
    for (const auto& entry : curves.back()) epochs.insert(entry.first);
  }
  // Two runs of one selection figure also get their difference, epoch by epoch.
  const bool difference = runs.size() == 2 && same;

  std::vector<std::string> head = {"epoch"};
  for (size_t i = 0; i < runs.size(); ++i) head.push_back("[" + std::to_string(i + 1) + "]");
  if (difference) head.push_back("[2] - [1]");
  std::vector<std::vector<std::string>> rows;
  for (const int64_t epoch : epochs) {
    std::vector<std::string> row = {std::to_string(epoch)};
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto it = curves[i].find(epoch);
      // A blank where no "*" stands keeps the digits of a column aligned.
      row.push_back((it == curves[i].end() ? "-" : fixed(it->second, 4)) + (epoch == runs[i].selected_epoch ? "*" : " "));
    }
    if (difference) {
      const auto a = curves[0].find(epoch), b = curves[1].find(epoch);
      row.push_back(a == curves[0].end() || b == curves[1].end() ? "-" : fixed(b->second - a->second, 4, true));
    }
    rows.push_back(row);
  }
  // Each run's best validation and its epoch (the first, where it repeats), as the trainer
  // selects; for an unfinished run, its best so far.
  std::vector<std::string> best = {"best"};
  for (const auto& curve : curves) {
    const auto it = std::max_element(curve.begin(), curve.end(),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
    best.push_back(it == curve.end() ? "- " : fixed(it->second, 4) + " (" + std::to_string(it->first) + ")");
  }
  if (difference) best.push_back("");

  std::ostringstream out;
  out << (same ? "valid " + selection(runs[0]) : std::string("each run's valid selection figure (named below)"))
      << " at every validated epoch (* each run's selected epoch so far; the last record of an epoch validated twice):\n";
  for (size_t i = 0; i < runs.size(); ++i)
    out << "  [" << i + 1 << "] " << runs[i].dir << (same ? "" : ": " + selection(runs[i]))
        << (curves[i].empty() ? " (no validation recorded)" : "") << "\n";
  std::vector<std::vector<std::string>> table = {head};
  table.insert(table.end(), rows.begin(), rows.end());
  if (!epochs.empty()) table.push_back(best);
  out << aligned_table(table, true);  // numbers right-aligned, the epoch too
  return out.str();
}

}  // namespace seqrec::train
