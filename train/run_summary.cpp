#include "train/run_summary.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

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

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "HR@5=... HR@10=... NDCG@10=... MRR=..." in a fixed order, then any other metric.
std::string format_metrics(const MetricsRecord& r) {
  static const std::vector<std::string> kSkip = {"epoch", "step", "users", "seconds", "tied"};
  std::vector<std::string> names;
  for (const auto& [name, v] : r.numbers)
    if (std::find(kSkip.begin(), kSkip.end(), name) == kSkip.end()) names.push_back(name);
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

std::string describe_run(const std::string& dir) {
  // metrics.jsonl: every evaluation, in order (a resumed run appends).
  std::vector<MetricsRecord> records;
  {
    std::ifstream in(fs::path(dir) / "metrics.jsonl");
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        records.push_back(parse_metrics_line(line));
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error((fs::path(dir) / "metrics.jsonl").string() + " line " + std::to_string(n) +
                                 ": not a metrics record (" + e.what() + ")");
      }
    }
  }
  // train.log: the facts the trainer states in words. A sitting starts at each "[setup] dataset=".
  std::string model, log_dataset, select_metric, select_candidates, last_select, test_line, stop_line, error_line,
      done_time;
  int64_t sittings = 0, last_epoch = -1, epochs = -1, last_step = -1, selected_epoch = -1;
  double peak_rss = -1;
  {
    std::ifstream in(fs::path(dir) / "train.log");
    std::string line;
    bool error_continues = false;
    while (std::getline(in, line)) {
      if (!starts_with(line, "[error] ")) error_continues = false;
      if (starts_with(line, "[setup] dataset=")) {
        ++sittings;
        log_dataset = field_after(line, "dataset=");
        stop_line.clear();
        error_line.clear();
      } else if (starts_with(line, "[setup] model=")) {
        model = field_after(line, "model=");
      } else if (starts_with(line, "[setup] model selection: valid ")) {
        const auto under = line.find(" under \"");
        select_metric = line.substr(31, under == std::string::npos ? std::string::npos : under - 31);
        if (under != std::string::npos) {
          select_candidates = line.substr(under + 8);
          if (!select_candidates.empty() && select_candidates.back() == '"') select_candidates.pop_back();
        }
      } else if (starts_with(line, "[select] new best valid ")) {
        last_select = line.substr(24);
        selected_epoch = std::atoll(field_after(line, " at epoch ").c_str());
      } else if (starts_with(line, "[train] epoch ")) {
        const std::string e = field_after(line, "[train] epoch ");
        last_epoch = std::atoll(e.c_str());
        if (const auto slash = e.find('/'); slash != std::string::npos) epochs = std::atoll(e.c_str() + slash + 1);
        last_step = std::atoll(field_after(line, " step ").c_str());
      } else if (starts_with(line, "[stop] ")) {
        stop_line = line.substr(7);
      } else if (starts_with(line, "[error] ")) {
        // One error may take several lines (each prefixed), joined here; a later one replaces it.
        std::string part = line.substr(8);
        part.erase(0, part.find_first_not_of(" \t"));
        if (error_continues && !error_line.empty())
          error_line += (error_line.back() == ':' ? " " : "; ") + part;
        else
          error_line = part;
        error_continues = true;
        continue;
      } else if (starts_with(line, "[done] steps=")) {
        last_step = std::atoll(field_after(line, "steps=").c_str());
        done_time = field_after(line, "train time/epoch=");
        peak_rss = std::max(peak_rss, std::atof(field_after(line, "peak RSS/rank=").c_str()));
      } else if (starts_with(line, "[test] ")) {
        test_line = line.substr(7);
      }
    }
  }
  if (model.empty()) {
    std::ifstream flags(fs::path(dir) / "flags.txt");
    std::string line;
    while (std::getline(flags, line))
      if (starts_with(line, "model=") || starts_with(line, "--model=")) model = line.substr(line.find('=') + 1);
  }

  std::ostringstream out;
  std::string dataset = log_dataset;
  for (const auto& r : records)
    if (r.text.count("dataset")) dataset = r.text.at("dataset");
  out << "run: " << dir << "\n";
  out << "  model: " << (model.empty() ? "?" : model) << ", dataset: " << (dataset.empty() ? "?" : dataset)
      << ", sittings: " << sittings << "\n";
  int64_t last_valid = -1, validations = 0;
  for (const auto& r : records)
    if (r.text.count("split") && r.text.at("split") == "valid" && r.numbers.count("epoch")) {
      if (static_cast<int64_t>(r.numbers.at("epoch")) != last_valid) ++validations;
      last_valid = static_cast<int64_t>(r.numbers.at("epoch"));
    }
  out << "  trained: ";
  if (last_step >= 0)
    out << last_step << " steps"
        << (last_epoch >= 0 ? " (the last progress line in epoch " + std::to_string(last_epoch) +
                                  (epochs > 0 ? " of " + std::to_string(epochs) : "") + ")"
                            : "");
  else
    out << "no training step logged";
  out << "; " << validations << " validation(s)" << (last_valid >= 0 ? ", the last at epoch " + std::to_string(last_valid) : "")
      << "\n";
  const bool tested = !test_line.empty();
  out << "  status: ";
  if (!error_line.empty())
    out << "failed (" << error_line << ")";
  else
    out << (tested ? "finished" : stop_line.empty() ? "in progress or interrupted (no test evaluation yet)" : "stopped")
        << (stop_line.empty() ? "" : " (" + stop_line + ")");
  out << "\n";

  // The selection metric at every validation under the selection protocol (the last record of
  // an epoch that was validated twice, as after a resume from an earlier checkpoint).
  if (!select_metric.empty()) {
    std::map<int64_t, double> curve;
    for (const auto& r : records)
      if (r.text.count("split") && r.text.at("split") == "valid" && r.numbers.count("epoch") &&
          r.numbers.count(select_metric) && r.text.count("candidates") && r.text.at("candidates") == select_candidates)
        curve[static_cast<int64_t>(r.numbers.at("epoch"))] = r.numbers.at(select_metric);
    if (!curve.empty()) {
      out << "  valid " << select_metric << " by epoch:";
      for (const auto& [epoch, v] : curve) out << " " << epoch << ":" << fixed(v, 4);
      out << "\n";
    }
  }

  // The selected model, with every protocol validated at its epoch.
  if (selected_epoch >= 0) {
    out << "  selected on valid " << select_metric << (select_candidates.empty() ? "" : " under \"" + select_candidates + "\"")
        << ": " << last_select << "\n";
    out << "  valid at the selected epoch:\n";
    for (const auto& r : records)
      if (r.text.count("split") && r.text.at("split") == "valid" && r.numbers.count("epoch") &&
          static_cast<int64_t>(r.numbers.at("epoch")) == selected_epoch)
        out << protocol_line(r);
  } else {
    out << "  selected: none yet (no validation improved on the start)\n";
  }

  // The test split: the trainer evaluates it once, at the end, with the selected model. More than
  // one test evaluation (a run extended after it finished) is said, not hidden.
  std::vector<const MetricsRecord*> tests;
  for (const auto& r : records)
    if (r.text.count("split") && r.text.at("split") == "test") tests.push_back(&r);
  if (!tests.empty()) {
    int64_t evaluations = 0;
    int64_t prev_step = -1;
    for (const auto* r : tests) {
      const int64_t step = r->numbers.count("step") ? static_cast<int64_t>(r->numbers.at("step")) : -1;
      if (step != prev_step) ++evaluations;
      prev_step = step;
    }
    const int64_t final_step = prev_step;
    const int64_t test_epoch = tests.back()->numbers.count("epoch") ? static_cast<int64_t>(tests.back()->numbers.at("epoch")) : -1;
    out << "  test (" << (test_line.empty() ? "" : test_line + "; ") << "epoch " << test_epoch;
    if (evaluations > 1) out << "; WARNING: the test split was evaluated " << evaluations << " times, the last shown";
    out << "):\n";
    for (const auto* r : tests)
      if ((r->numbers.count("step") ? static_cast<int64_t>(r->numbers.at("step")) : -1) == final_step) out << protocol_line(*r);
  }
  if (!done_time.empty())
    out << "  time: " << done_time << " s/epoch training (the last finished sitting), peak RSS/rank " << fixed(peak_rss, 0)
        << " MiB (the largest finished sitting)\n";
  return out.str();
}

}  // namespace seqrec::train
