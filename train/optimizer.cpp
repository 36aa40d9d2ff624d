#include "train/optimizer.h"

#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

namespace seqrec::train {

Adam::Adam(std::vector<std::pair<std::string, at::Tensor>> params, AdamOptions options)
    : params_(std::move(params)), o_(options) {
  for (auto& [name, p] : params_) {
    m_.push_back(torch::zeros_like(p));
    v_.push_back(torch::zeros_like(p));
  }
}

void Adam::zero_grad() {
  for (auto& [name, p] : params_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

void Adam::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(step_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad();
    if (o_.weight_decay != 0) {
      if (!o_.decoupled)
        g = g.add(p, o_.weight_decay);
      else if (decays_decoupled(p))
        p.mul_(1.0 - lr * o_.weight_decay);  // before the update, as torch.optim.AdamW
    }
    m_[i].mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
    v_[i].mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
    auto denom = (v_[i].sqrt() / bc2_sqrt).add_(o_.eps);
    p.addcdiv_(m_[i], denom, -step_size);
  }
}

std::vector<std::pair<std::string, at::Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("step", torch::tensor({step_}, torch::kInt64));
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg/" + params_[i].first, m_[i]);
    out.emplace_back("exp_avg_sq/" + params_[i].first, v_[i]);
  }
  return out;
}

void Adam::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  auto get = [&](const std::string& key, const at::Tensor& like) {
    auto it = by_name.find(key);
    if (it == by_name.end()) throw std::runtime_error("optimizer state has no entry '" + key + "'");
    if (it->second.sizes() != like.sizes())
      throw std::runtime_error("optimizer state '" + key + "' has shape " +
                               c10::str(it->second.sizes()) + ", expected " + c10::str(like.sizes()));
    return it->second;
  };
  torch::NoGradGuard no_grad;
  auto s = by_name.find("step");
  if (s == by_name.end()) throw std::runtime_error("optimizer state has no entry 'step'");
  for (size_t i = 0; i < params_.size(); ++i) {
    m_[i].copy_(get("exp_avg/" + params_[i].first, m_[i]));
    v_[i].copy_(get("exp_avg_sq/" + params_[i].first, v_[i]));
  }
  step_ = s->second.item<int64_t>();
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double extra_sq,
                      const std::vector<at::Tensor>& also_scaled) {
  torch::NoGradGuard no_grad;
  double sq = extra_sq;
  for (auto& p : params)
    if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto* list : {&params, &also_scaled})
      for (auto& p : *list)
        if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  return norm;
}

void LrSchedule::validate() const {
  if (!(lr > 0)) throw std::invalid_argument("lr_schedule: the learning rate must be > 0");
  if (warmup_steps < 0) throw std::invalid_argument("lr_schedule: warmup_steps must be >= 0");
  if (decay_start < 0) throw std::invalid_argument("--lr_decay_from_epoch must be >= 0");
  if (kind == "constant") {
    if (decay_start > 0)
      throw std::invalid_argument("--lr_decay_from_epoch applies to a decaying --lr_schedule (cosine or linear)");
    return;
  }
  if (kind != "cosine" && kind != "linear")
    throw std::invalid_argument("--lr_schedule must be constant, cosine or linear; got '" + kind + "'");
  if (!(final_ratio >= 0 && final_ratio <= 1))
    throw std::invalid_argument("--lr_final_ratio must be in [0, 1], got " + std::to_string(final_ratio));
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == "constant") return lr;
  if (step >= decay_end) return lr * final_ratio;
  const int64_t begin = decay_begin();
  if (step < begin) return lr;
  const double t = static_cast<double>(step - begin) / static_cast<double>(decay_end - begin);
  const double fraction = kind == "cosine" ? 0.5 * (1.0 + std::cos(std::acos(-1.0) * t)) : 1.0 - t;  // 1 -> 0
  return lr * (final_ratio + (1.0 - final_ratio) * fraction);
}

std::string LrSchedule::describe() const {
  std::ostringstream s;
  s.precision(6);
  if (kind == "constant")
    s << "constant " << lr;
  else if (decays())
    s << kind << " " << lr << " -> " << lr * final_ratio << " over steps " << decay_begin() << "-" << decay_end;
  else  // a decay planned to begin at or past the run's end never runs: over the run's steps the
        // rate is the constant one, and it is named so (a run resumed to go on under the decay is
        // then a constant-rate run continued, as the trainer allows)
    s << "constant " << lr << " (the " << kind << " decay planned from step " << decay_begin()
      << " begins at or after the run's end, step " << decay_end << ")";
  if (warmup_steps > 0) s << ", linear warm-up over the first " << warmup_steps << " steps";
  return s.str();
}

int64_t held_until(const std::string& described) {
  if (described.rfind("constant ", 0) == 0) return std::numeric_limits<int64_t>::max();
  if (described.rfind("cosine ", 0) != 0 && described.rfind("linear ", 0) != 0) return -1;
  const std::string marker = " over steps ";
  const size_t at = described.find(marker);
  if (at == std::string::npos) return -1;
  const size_t from = at + marker.size();
  size_t end = from;
  while (end < described.size() && std::isdigit(static_cast<unsigned char>(described[end]))) ++end;
  if (end == from || end >= described.size() || described[end] != '-') return -1;
  return std::stoll(described.substr(from, end - from));
}

}  // namespace seqrec::train
