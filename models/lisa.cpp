// LISA (Wu et al., WWW'21): linear-time self-attention over codeword histograms. Item embeddings
// (scaled by sqrt(D)) are quantized by B codebooks of W codewords with residual encoding,
// bilinear similarity and a temperature softmax (straight-through hard codes for Base and Mini,
// soft weights for Soft); attention of each item's codeword over the decayed causal histogram of
// the sequence's codewords, per codebook, through projected codebook tables
// (ops/lisa_attention). Targets: Base quantizes them with the same codebooks, Soft scores raw
// embeddings, Mini quantizes them with a separate, larger codebook set.
//
// Codebooks learn by back-propagation (the paper's rule) or, with --codebook_update ema, by
// exponential moving averages of per-codeword assignment counts and assigned-residual sums
// (Laplace-smoothed, dead codewords restarted by splitting the busiest one). The sums of each
// step are exposed through pending_statistics() so the trainer all-reduces them before
// apply_statistics(): N ranks with batch b update exactly as one rank with batch N·b.
#include <cmath>
#include <iomanip>
#include <sstream>

#include "models/backbone.h"
#include "models/ema.h"
#include "ops/dropout/dropout.h"
#include "ops/lisa_attention/lisa_attention.h"

namespace seqrec::models {
namespace {

struct Codes {
  at::Tensor recon;    // [N, D] sum of the chosen (or, for soft, weighted) codewords
  at::Tensor weights;  // [N, C, W] assignment weights (straight-through one-hot, or soft)
  at::Tensor index;    // [N, C] hard codeword per codebook
};

class QuantizerImpl : public torch::nn::Module {
 public:
  QuantizerImpl(int64_t dim, int64_t books, int64_t words, double temperature, bool soft, bool ema,
                double ema_decay)
      : books_(books), words_(words), temperature_(temperature), soft_(soft), ema_(ema), ema_decay_(ema_decay) {
    bilinear_ = register_parameter("bilinear", torch::empty({dim, dim}));
    if (ema_) {
      codebooks_ = register_buffer("codebooks", torch::empty({books, words, dim}));
      ema_count_ = register_buffer("ema_count", torch::ones({books, words}));
      ema_sum_ = register_buffer("ema_sum", torch::zeros({books, words, dim}));
      pending_count_ = torch::zeros({books, words});
      pending_sum_ = torch::zeros({books, words, dim});
    } else {
      codebooks_ = register_parameter("codebooks", torch::empty({books, words, dim}));
    }
  }

  // Xavier-normal with the 3-D fan rule of the released code (fan_in = W·D, fan_out = B·D).
  void initialise(at::Generator& gen) {
    torch::NoGradGuard no_grad;
    const double D = codebooks_.size(2);
    const double std = std::sqrt(2.0 / (words_ * D + books_ * D));
    codebooks_.copy_(at::normal(0.0, std, codebooks_.sizes(), gen, codebooks_.options()));
    bilinear_.copy_(at::normal(0.0, std::sqrt(1.0 / D), bilinear_.sizes(), gen, bilinear_.options()));
    if (ema_) ema_sum_.copy_(codebooks_);  // a count of 1 per codeword at its initial position
  }

  const at::Tensor& codebooks() const { return codebooks_; }
  int64_t books() const { return books_; }
  int64_t words() const { return words_; }

  // e [N, D]; count [N] float: how many real (non-padding) slots each row stands for in the
  // EMA statistics (rows are usually the distinct items of a batch).
  Codes encode(const at::Tensor& e, const at::Tensor& count, bool collect) {
    auto r = e;
    std::vector<at::Tensor> weights, index;
    at::Tensor recon = torch::zeros_like(e);
    for (int64_t b = 0; b < books_; ++b) {
      auto book = codebooks_[b];                                        // [W, D]
      auto logits = torch::matmul(torch::matmul(r, bilinear_), book.t()) / temperature_;
      auto p = torch::softmax(logits, -1);
      auto idx = std::get<1>(logits.detach().max(-1));                  // first maximum on ties
      auto hard = torch::zeros_like(p).scatter_(1, idx.unsqueeze(1), 1.0);
      at::Tensor w, q;
      if (soft_) {
        w = p;
        q = torch::matmul(p, book);
      } else {
        w = is_training() ? p + (hard - p).detach() : hard;
        q = is_training() ? torch::matmul(w, book) : book.index_select(0, idx);
      }
      if (collect && ema_ && is_training()) {
        torch::NoGradGuard no_grad;
        follow_device(pending_count_, pending_sum_, ema_count_);
        auto h = hard * count.unsqueeze(1).to(hard.scalar_type());
        pending_count_[b] += h.sum(0);
        pending_sum_[b] += torch::matmul(h.t(), r.detach());
      }
      recon = recon + q;
      r = r - q;
      weights.push_back(w);
      index.push_back(idx);
    }
    return {recon, torch::stack(weights, 1), torch::stack(index, 1)};
  }

  std::vector<at::Tensor> pending() {
    if (!ema_) return {};
    follow_device(pending_count_, pending_sum_, ema_count_);
    return {pending_count_, pending_sum_};
  }

  // One EMA update from the (already all-reduced) pending sums, then clear them.
  void apply() {
    if (!ema_) return;
    torch::NoGradGuard no_grad;
    ema_fold(ema_count_, ema_sum_, pending_count_, pending_sum_, ema_decay_);
    // Dead codewords (an expected count below 1e-3) restart as a copy of the busiest codeword
    // of their codebook, nudged apart, and take half its statistics: a deterministic split, so
    // every rank makes the same choice from the same all-reduced statistics.
    auto dead = ema_count_ < 1e-3;
    if (dead.any().item<bool>()) {
      for (int64_t b = 0; b < books_; ++b) {
        auto dead_b = dead[b].nonzero().view(-1);
        for (int64_t i = 0; i < dead_b.numel(); ++i) {
          const int64_t w = dead_b[i].item<int64_t>();
          const int64_t top = ema_count_[b].argmax().item<int64_t>();
          ema_count_[b][top].mul_(0.5);
          ema_sum_[b][top].mul_(0.5);
          ema_count_[b][w].copy_(ema_count_[b][top]);
          const double sign = (w % 2 == 0) ? 1.0 : -1.0;
          ema_sum_[b][w].copy_(ema_sum_[b][top] * (1.0 + sign * 1e-2));
        }
      }
    }
    codebooks_.copy_(smoothed_means(ema_count_, ema_sum_));
  }

 private:
  int64_t books_, words_;
  double temperature_;
  bool soft_, ema_;
  double ema_decay_;
  at::Tensor bilinear_, codebooks_, ema_count_, ema_sum_, pending_count_, pending_sum_;
};

class LisaCoderImpl : public InputCoderImpl {
 public:
  explicit LisaCoderImpl(const ModelOptions& o) : o_(o) {
    const bool soft = o.lisa_variant == "soft", ema = o.codebook_update == "ema";
    sequence_ = register_module("sequence_pq", std::make_shared<QuantizerImpl>(
                                                   o.hidden, o.codebooks, o.codewords, o.lisa_temperature,
                                                   soft, ema, o.ema_decay));
    if (o.lisa_variant == "mini")
      target_ = register_module("target_pq", std::make_shared<QuantizerImpl>(
                                                 o.hidden, o.target_codebooks, o.target_codewords,
                                                 o.lisa_temperature, false, ema, o.ema_decay));
  }

  void initialise(at::Generator& gen) override {
    sequence_->initialise(gen);
    if (target_) target_->initialise(gen);
  }

  // Every slot holding an item has the same scaled embedding and therefore the same codes, so
  // each distinct item of the batch is quantized once and its codes gathered into its slots
  // (ML-1M at L = 300: ~3,000 distinct items among ~38,000 slots; a LISA-Base step takes 17%
  // less time, docs/results.md). The result and the gradients are those of
  // quantizing every slot: the gather's backward sums the slots' gradients into the item's row,
  // as the embedding's backward would have; EMA statistics count each item once per real slot.
  at::Tensor encode_input(const at::Tensor& scaled, const at::Tensor& ids, const at::Tensor& item_table,
                          AttentionContext& ctx) override {
    const int64_t B = ids.size(0), L = ids.size(1), D = scaled.size(2);
    if (const Codes* all = shared_codes(item_table)) {
      // Base: the rows were quantized by targets() for this step; gather them.
      auto id = ids.reshape(-1);
      ctx.code_weights = all->weights.index_select(0, id).reshape({B, L, sequence_->books(), sequence_->words()});
      ctx.code_index = all->index.index_select(0, id).reshape({B, L, sequence_->books()});
      auto recon = all->recon.index_select(0, id);
      if (o_.lisa_commitment > 0 && is_training()) {
        auto diff = (scaled.reshape({B * L, D}) - recon.detach()).pow(2).sum(-1).masked_fill(id.eq(0), 0.0);
        auto term = diff.sum() * o_.lisa_commitment;
        aux_ = aux_.defined() ? aux_ + term : term;
      }
      return recon.reshape({B, L, D});
    }
    auto flat = scaled.reshape({B * L, D});
    auto id = ids.reshape(-1);
    auto [distinct, inverse, slots] = at::_unique2(id, /*sorted=*/true, /*return_inverse=*/true,
                                                   /*return_counts=*/true);
    const int64_t U = distinct.size(0);
    // One slot of each distinct item (any of its slots holds the same row).
    auto first = torch::zeros({U}, id.options()).index_put_({inverse}, torch::arange(B * L, id.options()));
    auto rows = flat.index_select(0, first);
    auto count = slots.to(flat.scalar_type()).masked_fill(distinct.eq(0), 0.0);  // padding counts for nothing
    auto codes = sequence_->encode(rows, count, /*collect=*/true);
    // Mini's target codebooks see the batch's items too, for their EMA statistics.
    if (target_ && is_training() && o_.codebook_update == "ema") {
      torch::NoGradGuard no_grad;
      target_->encode(rows.detach(), count, /*collect=*/true);
    }
    ctx.code_weights =
        codes.weights.index_select(0, inverse).reshape({B, L, sequence_->books(), sequence_->words()});
    ctx.code_index = codes.index.index_select(0, inverse).reshape({B, L, sequence_->books()});
    if (o_.lisa_commitment > 0 && is_training()) {
      auto diff = (rows - codes.recon.detach()).pow(2).sum(-1) * count;
      auto term = diff.sum() * o_.lisa_commitment;
      aux_ = aux_.defined() ? aux_ + term : term;
    }
    return codes.recon.index_select(0, inverse).reshape({B, L, D});
  }

  at::Tensor targets(const at::Tensor& table) override {
    auto scaled = table * std::sqrt(static_cast<double>(o_.hidden));
    if (o_.lisa_variant == "soft") return scaled;
    auto none = torch::zeros({table.size(0)}, table.options());
    auto codes = (target_ ? target_ : sequence_)->encode(scaled, none, /*collect=*/false);
    if (shares_codes()) remember_codes(table, codes);
    return codes.recon;
  }

  // The decayed codeword histogram is the whole per-user state: F <- gamma·F + codes(item).
  bool supports_online() const override { return true; }
  at::Tensor online_step(const at::Tensor& scaled, at::Tensor& state, AttentionContext& ctx) override {
    const int64_t D = scaled.size(2), C = sequence_->books(), W = sequence_->words();
    auto codes = sequence_->encode(scaled.reshape({1, D}), torch::ones({1}, scaled.options()), /*collect=*/false);
    auto w = codes.weights.reshape({C, W});
    state = state.defined() ? state * std::exp(-o_.lisa_decay) + w : w.clone();
    // Long-unseen codewords decay into fp32 denormals (below ~1e-38 after ~900 steps at
    // e^-0.1), whose arithmetic is many times slower on x86; next to the newest item's weight
    // of 1 in every codebook they are nothing, so they are flushed to zero.
    state.masked_fill_(state < 1e-30, 0.0);
    ctx.code_weights = state.view({1, 1, C, W});
    ctx.code_index = codes.index.reshape({1, 1, C});
    return codes.recon.reshape({1, 1, D});
  }

  // Per codebook set: codewords in use per codebook, distinct full codes among the items (two
  // items with one code get identical target scores under Base and Mini), the largest group
  // sharing a code, and the relative reconstruction error of the scaled item embeddings.
  std::string describe_state(const at::Tensor& item_table) override {
    auto scaled = item_table.narrow(0, 1, item_table.size(0) - 1) * std::sqrt(static_cast<double>(o_.hidden));
    const int64_t N = scaled.size(0);
    auto none = torch::zeros({N}, scaled.options());
    std::ostringstream line;
    line << std::fixed << std::setprecision(3);
    for (auto* q : {sequence_.get(), target_.get()}) {
      if (!q) continue;
      auto codes = q->encode(scaled, none, /*collect=*/false);
      auto idx = codes.index;  // [N, C]
      std::vector<int64_t> used;
      for (int64_t b = 0; b < q->books(); ++b) used.push_back(std::get<0>(at::_unique(idx.select(1, b))).numel());
      // Distinct rows of the [N, C] code matrix, with their multiplicities.
      auto [uniq, inverse, counts] = at::unique_dim(idx, 0, /*sorted=*/true, /*return_inverse=*/false,
                                                    /*return_counts=*/true);
      (void)inverse;
      const double err = ((scaled - codes.recon).norm() / scaled.norm().clamp_min(1e-12)).item<double>();
      line << (q == sequence_.get() ? "sequence codebooks" : "; target codebooks") << " (" << q->books() << " x "
           << q->words() << "): codewords used per codebook";
      for (size_t b = 0; b < used.size(); ++b) line << (b ? "," : " ") << used[b];
      line << "; distinct item codes " << uniq.size(0) << "/" << N << " (largest group "
           << counts.max().item<int64_t>() << "); reconstruction error " << err;
    }
    return line.str();
  }

  std::vector<at::Tensor> pending_statistics() override {
    auto s = sequence_->pending();
    if (target_)
      for (auto& t : target_->pending()) s.push_back(t);
    return s;
  }
  void apply_statistics() override {
    sequence_->apply();
    if (target_) target_->apply();
  }
  at::Tensor take_auxiliary_loss() override {
    auto a = aux_;
    aux_ = at::Tensor();
    return a;
  }

  QuantizerImpl* sequence() { return sequence_.get(); }

 private:
  // Base with gradient-trained codebooks quantizes targets and inputs with one codebook set, and
  // an input row is its item's table row (item_emb(id)·sqrt(D) either way). So the codes of
  // every item that targets() computes serve every slice of the same forward: a training step
  // quantizes |items| rows instead of |items| plus every slice's distinct items again (ML-1M,
  // L 300, 8 slices: ~3,400 rows against ~13,000). The codes are reused only while nothing they
  // depend on has changed (the table and the quantizer's parameters by their version counters,
  // training mode, grad mode) and, under autograd, until a backward has gone through them
  // (which frees their graph). EMA codebooks collect per-slot statistics as they encode, so they
  // keep the per-slice path.
  struct SharedCodes {
    const void* data = nullptr;
    int64_t rows = -1;
    std::vector<int64_t> versions;
    bool training = false, grad = false;
    std::shared_ptr<bool> consumed;
    Codes codes;
  };

  bool shares_codes() const { return !target_ && o_.lisa_variant == "base" && o_.codebook_update == "grad"; }

  std::vector<int64_t> versions(const at::Tensor& table) const {
    return {table._version(), sequence_->codebooks()._version(), sequence_->named_parameters()["bilinear"]._version()};
  }

  void remember_codes(const at::Tensor& table, const Codes& codes) {
    shared_ = SharedCodes{table.data_ptr(), table.size(0), versions(table), is_training(),
                          at::GradMode::is_enabled(), std::make_shared<bool>(false), codes};
    if (codes.recon.requires_grad()) {
      auto consumed = shared_.consumed;
      shared_.codes.recon.register_hook([consumed](const at::Tensor& grad) {
        *consumed = true;
        return grad;
      });
    }
  }

  const Codes* shared_codes(const at::Tensor& table) const {
    if (!shares_codes() || shared_.data != table.data_ptr() || shared_.rows != table.size(0)) return nullptr;
    if (shared_.training != is_training() || shared_.grad != at::GradMode::is_enabled() || !shared_.consumed || *shared_.consumed ||
        shared_.versions != versions(table))
      return nullptr;
    return &shared_.codes;
  }

  ModelOptions o_;
  std::shared_ptr<QuantizerImpl> sequence_, target_;
  at::Tensor aux_;
  SharedCodes shared_;
};

// Per codebook b: table T_b = (C_b P^Q_b)(C_b P^K_b)ᵀ / sqrt(D) and values C_b P^V_b, recomputed
// every forward (differentiable); the attention reads the input items' codes from the context.
class LisaAttentionImpl : public AttentionModuleImpl {
 public:
  LisaAttentionImpl(const ModelOptions& o, QuantizerImpl* codebooks)
      : dim_(o.hidden), gamma_(std::exp(-o.lisa_decay)), dropout_(o.dropout), codebooks_(codebooks) {
    const int64_t C = codebooks->books(), D = o.hidden;
    pq_ = register_parameter("proj_q", torch::empty({C, D, D}));
    pk_ = register_parameter("proj_k", torch::empty({C, D, D}));
    pv_ = register_parameter("proj_v", torch::empty({C, D, D}));
  }

  // Xavier-uniform with the 3-D fan rule (fan_in = D·D, fan_out = C·D), as released.
  void initialise(at::Generator& gen) override {
    torch::NoGradGuard no_grad;
    const double C = pq_.size(0), D = dim_;
    const double bound = std::sqrt(6.0 / (D * D + C * D));
    for (auto* p : {&pq_, &pk_, &pv_}) p->copy_(at::rand(p->sizes(), gen, p->options()) * (2 * bound) - bound);
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    TORCH_CHECK(ctx.code_weights.defined(), "LISA attention needs the input items' codes in the context");
    at::Tensor table, values;
    tables(table, values);
    // Dropout on the attention output (none on the weights), as in the released code.
    return ops::dropout(ops::lisa_attention(ctx.code_weights, ctx.code_index, ctx.key_padding, table, values, gamma_),
                        dropout_, is_training());
  }

 private:
  // The W x W tables and the projected values. Training recomputes them every forward (they
  // carry gradients); inference without autograd reuses them until a parameter or codebook
  // changes (tracked by the tensors' version counters, which every in-place update bumps).
  void tables(at::Tensor& table, at::Tensor& values) {
    const auto& C = codebooks_->codebooks();  // [C, W, D]
    const bool cacheable = !is_training() && !at::GradMode::is_enabled();
    // _version() is uint32_t in LibTorch 1.13 and int64_t in 2.x.
    const std::vector<int64_t> version = {static_cast<int64_t>(C._version()), static_cast<int64_t>(pq_._version()),
                                          static_cast<int64_t>(pk_._version()), static_cast<int64_t>(pv_._version())};
    if (cacheable && cached_table_.defined() && version == cached_version_ &&
        C.data_ptr() == cached_codebooks_) {
      table = cached_table_;
      values = cached_values_;
      return;
    }
    table = torch::bmm(torch::bmm(C, pq_), torch::bmm(C, pk_).transpose(1, 2)) / std::sqrt(double(dim_));
    values = torch::bmm(C, pv_);
    if (cacheable) {
      cached_table_ = table;
      cached_values_ = values;
      cached_version_ = version;
      cached_codebooks_ = C.data_ptr();
    } else {
      cached_table_ = cached_values_ = at::Tensor();
    }
  }

  at::Tensor cached_table_, cached_values_;
  std::vector<int64_t> cached_version_;
  const void* cached_codebooks_ = nullptr;

  int64_t dim_;
  double gamma_, dropout_;
  QuantizerImpl* codebooks_;  // owned by the input coder (registered there, not here)
  at::Tensor pq_, pk_, pv_;
};

}  // namespace

std::unique_ptr<SequenceModel> make_lisa(const ModelOptions& o) {
  auto coder = std::make_shared<LisaCoderImpl>(o);
  BackboneSpec spec;
  spec.input_coder = coder;
  spec.attention_reads_input = false;
  QuantizerImpl* books = coder->sequence();
  spec.attention = [o, books](int64_t) { return std::make_shared<LisaAttentionImpl>(o, books); };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
