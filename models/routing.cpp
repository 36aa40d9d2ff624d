// Routing attention (Roy et al., TACL 2021) on the shared backbone: per block, `routing_heads`
// heads route by online spherical k-means and the other heads attend a local window
// (ops/routing_attention). Routing heads share one query/key projection (the paper's choice for
// causal models), LayerNormed without scale or bias as the paper does before clustering; each
// slot attends the top-W keys of its cluster taken from the prefix before its chunk, plus
// itself.
//
// Centroids are not trained by gradient: each training forward adds, per routing head and
// centroid, the count and the sum of the unit routing vectors whose nearest centroid it is
// (real slots only). The trainer all-reduces those sums across ranks before apply_statistics()
// folds them into exponential moving averages (VQ-style, Laplace-smoothed counts), so N ranks
// with batch b update exactly as one rank with batch N·b; the centroid is the smoothed mean,
// renormalised to unit length (spherical k-means). A commitment term pulls each routing vector
// towards its centroid, as the official code's e_loss does.
#include <cmath>

#include "models/backbone.h"
#include "models/ema.h"
#include "ops/routing_attention/routing_attention.h"

namespace seqrec::models {
namespace {

class RoutingAttentionImpl : public AttentionModuleImpl {
 public:
  RoutingAttentionImpl(const ModelOptions& o)
      : heads_(o.heads),
        routed_(o.routing_heads),
        dh_(o.hidden / o.heads),
        sizes_(routing_sizes(o)),
        dropout_(o.dropout),
        decay_(o.routing_decay),
        commitment_(o.routing_commitment) {
    const int64_t local = heads_ - routed_;
    // One GEMM for every head: local q, k, v, then the routing heads' shared q/k and v.
    proj_ = register_module("proj", torch::nn::Linear(o.hidden, (3 * local + 2 * routed_) * dh_));
    out_ = register_module("out", torch::nn::Linear(o.hidden, o.hidden));
    centroids_ = register_buffer("centroids", torch::zeros({routed_, sizes_.clusters, dh_}));
    ema_count_ = register_buffer("ema_count", torch::ones({routed_, sizes_.clusters}));
    ema_sum_ = register_buffer("ema_sum", torch::zeros({routed_, sizes_.clusters, dh_}));
    pending_count_ = torch::zeros({routed_, sizes_.clusters});
    pending_sum_ = torch::zeros({routed_, sizes_.clusters, dh_});
  }

  // Random unit centroids from the shared generator (identical on every rank); each starts
  // as the mean of one vector at its own position.
  void initialise(at::Generator& gen) override {
    torch::NoGradGuard no_grad;
    auto c = at::normal(0.0, 1.0, centroids_.sizes(), gen, centroids_.options());
    centroids_.copy_(c / c.norm(2, -1, true));
    ema_sum_.copy_(centroids_);
    ema_count_.fill_(1.0);
  }

  at::Tensor forward(const at::Tensor& x, AttentionContext& ctx) override {
    const int64_t B = x.size(0), L = x.size(1), local = heads_ - routed_;
    auto p = apply_linear(proj_, x).view({B, L, 3 * local + 2 * routed_, dh_}).transpose(1, 2);  // [B, parts, L, dh]
    std::vector<at::Tensor> heads;
    if (local > 0) {
      auto q = p.narrow(1, 0, local), k = p.narrow(1, local, local), v = p.narrow(1, 2 * local, local);
      heads.push_back(ops::local_attention(q, k, v, ctx.key_padding, sizes_.local_window, dropout_, is_training()));
    }
    auto shared = p.narrow(1, 3 * local, routed_);
    auto v = p.narrow(1, 3 * local + routed_, routed_);
    // LayerNorm without scale or bias puts every routing vector on the sphere of radius sqrt(dh).
    auto r = at::layer_norm(shared, {dh_}, {}, {}, 1e-6);
    auto plan = ops::causal_balanced_routing(r.detach(), centroids_, ctx.key_padding, sizes_.window, sizes_.chunk);
    heads.push_back(ops::routed_attention(r, v, plan, ctx.key_padding, 1.0 / std::sqrt(static_cast<double>(dh_)),
                                          dropout_, is_training()));
    if (is_training()) collect(r, plan.cluster, ctx.key_padding);
    auto o = heads.size() == 1 ? heads[0] : torch::cat(heads, 1);  // [B, H, L, dh]
    return apply_linear(out_, o.transpose(1, 2).reshape({B, L, heads_ * dh_}));
  }

  std::vector<at::Tensor> pending_statistics() override {
    follow_device(pending_count_, pending_sum_, ema_count_);
    return {pending_count_, pending_sum_};
  }

  void apply_statistics() override {
    torch::NoGradGuard no_grad;
    ema_fold(ema_count_, ema_sum_, pending_count_, pending_sum_, decay_);
    auto mean = smoothed_means(ema_count_, ema_sum_);
    // A centroid whose mean direction vanished (opposite vectors cancelling) keeps its place.
    auto norm = mean.norm(2, -1, true);
    centroids_.copy_(torch::where(norm > 1e-12, mean / norm.clamp_min(1e-12), centroids_));
  }

  at::Tensor take_auxiliary_loss() override {
    auto a = aux_;
    aux_ = at::Tensor();
    return a;
  }

 private:
  // Statistics and the commitment term of one training forward, over real slots.
  void collect(const at::Tensor& r, const at::Tensor& cluster, const at::Tensor& key_padding) {
    auto unit = r / r.norm(2, -1, true).clamp_min(1e-12);                       // [B, Hr, L, dh]
    auto real = key_padding.logical_not().unsqueeze(1).expand_as(cluster);     // [B, Hr, L]
    {
      torch::NoGradGuard no_grad;
      follow_device(pending_count_, pending_sum_, ema_count_);
      for (int64_t h = 0; h < routed_; ++h) {
        auto m = real.select(1, h).reshape({-1});
        auto idx = cluster.select(1, h).reshape({-1}).masked_select(m);
        auto vec = unit.select(1, h).detach().reshape({-1, dh_}).index_select(0, m.nonzero().view(-1));
        pending_count_[h].index_add_(0, idx, torch::ones({idx.size(0)}, pending_count_.options()));
        pending_sum_[h].index_add_(0, idx, vec);
      }
    }
    if (commitment_ > 0) {
      // centroid of each slot's cluster: [B, Hr, L, dh]
      const int64_t B = r.size(0), L = r.size(2);
      auto flat = cluster + torch::arange(routed_, cluster.options()).view({1, routed_, 1}) * sizes_.clusters;
      auto mu = centroids_.view({-1, dh_}).index_select(0, flat.reshape({-1})).view({B, routed_, L, dh_});
      auto term = (unit - mu).pow(2).sum(-1).masked_select(real).sum() * commitment_;
      aux_ = aux_.defined() ? aux_ + term : term;
    }
  }

  int64_t heads_, routed_, dh_;
  RoutingSizes sizes_;
  double dropout_, decay_, commitment_;
  torch::nn::Linear proj_{nullptr}, out_{nullptr};
  at::Tensor centroids_, ema_count_, ema_sum_, pending_count_, pending_sum_, aux_;
};

}  // namespace

std::unique_ptr<SequenceModel> make_routing(const ModelOptions& o) {
  BackboneSpec spec;
  spec.attention = [o](int64_t) { return std::make_shared<RoutingAttentionImpl>(o); };
  return make_backbone_model(o, spec);
}

}  // namespace seqrec::models
