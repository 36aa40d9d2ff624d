// Forward + backward time and peak memory of one attention op at one sequence length, for
// bench/attention_scaling.sh (one process per point, so each peak is the op's own).
//   attention_bench --op OP --len L [--tokens 16384] [--dim 64] [--heads 1] [--interests 20]
//                   [--codebooks 8] [--codewords 16] [--iters 3] [--device cpu|cuda|cuda:N]
// OP: softmax | linrec | linrec:global | linrec:packed | linrec:packed:bf16 | linear | linear:reference | linear:global | linear:global:reference
//     | lightsans | lightsans:reference | lisa | lisa:reference | routing
//     | routing:reference | gated:softmax[:topk][:reference|:rows]
//     | gated:cosine[:topk][:reference|:rows] | model:<name> | loss:softmax[:recompute][:reference]
// linrec:packed is linrec:global on the packed [B, L, 3·dim] projection the model passes (its heads
// read in place); linrec:packed:bf16 the same on its bfloat16 product and float32 bias, returning
// bfloat16 (what the model passes at --matmul_precision medium). linear is the causal linear-attention product alone (the fused kernel of the device: CPU or
// CUDA), linear:reference its chunked ATen reference; linear:global the non-causal product (the
// CPU's fused kernel), linear:global:reference q (kᵀ v) by batched products.
// (model:flash4rec:cosine for FLASH4Rec's linear form). routing is the causal routing op at the
// paper's optimum (K = W = S = round(sqrt(L)) centroids, window, chunk) with its local heads'
// window 2S (routing:reference: its routed heads through the ATen reference, not the device's
// kernel); gated:* is FLASH4Rec's attention (one head, s = e = dim; :topk with its config's Top-K
// dropout, k 10 at p 0.1; :reference the ATen reference; :rows the fused kernel's rows on the
// device given, the CPU included, where gated_attention runs the reference). model:<name> times a whole
// model (2 blocks, ML-1M's 3,416 items, every slot real): encode, a softmax over the items at the
// last slot, backward. loss:softmax is the full-catalogue softmax loss (ops/softmax_loss) over
// --tokens hidden states of --dim against --items items (default 3,416), keeping the forward's
// probabilities when they fit its budget; loss:softmax:recompute always recomputes them;
// :reference runs its row passes in ATen's ops instead of the fused CPU rows (--len is then
// only a required 1). Prints one JSON line: op, len, batch, device, ms (median
// fwd+bwd, the device synchronised), peak_mb (on the CPU the resident high-water mark above the
// inputs' baseline; on a CUDA device the peak allocated through Torch's caching allocator above
// the inputs').
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "models/model.h"
#include "ops/gated_attention/gated_attention.h"
#include "ops/interest_attention/interest_attention.h"
#include "ops/linear_attention/linear_attention.h"
#include "ops/lisa_attention/lisa_attention.h"
#include "ops/routing_attention/routing_attention.h"
#include "ops/softmax_attention/softmax_attention.h"
#include "ops/softmax_loss/softmax_loss.h"
#include "train/device.h"

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

double status_mb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::string(key).size()) / 1024.0;
  return 0;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "attention_bench: %s\nusage: attention_bench --op softmax|linrec|linrec:global|linrec:packed|linrec:packed:bf16|linear|linear:reference|linear:global|linear:global:reference|lightsans|lightsans:reference|lisa|lisa:reference|routing|routing:reference|"
               "gated:softmax|gated:cosine[:topk][:reference|:rows]|model:<name>[:cosine]|loss:softmax[:recompute][:reference] --len L "
               "[--tokens N] [--dim D] [--items N] [--heads H] [--interests K] [--codebooks C] [--codewords W] [--iters I] "
               "[--device cpu|cuda|cuda:N]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string op, device_name = "cpu";
  int64_t len = 0, tokens = 16384, dim = 64, heads = 1, interests = 20, codebooks = 8, codewords = 16, iters = 3,
          items = 3416;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    std::string v = argv[++i];
    if (a == "--op") op = v;
    else if (a == "--len") len = std::atoll(v.c_str());
    else if (a == "--tokens") tokens = std::atoll(v.c_str());
    else if (a == "--dim") dim = std::atoll(v.c_str());
    else if (a == "--heads") heads = std::atoll(v.c_str());
    else if (a == "--interests") interests = std::atoll(v.c_str());
    else if (a == "--codebooks") codebooks = std::atoll(v.c_str());
    else if (a == "--codewords") codewords = std::atoll(v.c_str());
    else if (a == "--iters") iters = std::atoll(v.c_str());
    else if (a == "--items") items = std::atoll(v.c_str());
    else if (a == "--device") device_name = v;
    else usage("unknown flag " + a);
  }
  if (len <= 0 || tokens < len || dim % heads != 0) usage("need --len in [1, tokens] and heads dividing dim");
  at::Device device(at::kCPU);
  try {
    device = seqrec::train::parse_device_name(device_name);
    seqrec::train::check_device_usable(device, device_name);
  } catch (const std::exception& e) {
    usage(e.what());
  }
  const bool on_gpu = device.is_cuda();
  const auto opt = torch::TensorOptions().device(device);
  torch::manual_seed(0);
  const int64_t B = tokens / len, dh = dim / heads;
  auto pad = torch::zeros({B, len}, opt.dtype(torch::kBool));
  std::vector<at::Tensor> leaves;
  auto leaf = [&](at::Tensor t) {
    t.requires_grad_(true);
    leaves.push_back(t);
    return t;
  };
  std::function<at::Tensor()> run;
  if (op == "softmax" || op == "linrec" || op == "linrec:global" || op == "linear" || op == "linear:reference" ||
      op == "linear:global" || op == "linear:global:reference") {
    auto q = leaf(torch::randn({B, heads, len, dh}, opt)), k = leaf(torch::randn({B, heads, len, dh}, opt)),
         v = leaf(torch::randn({B, heads, len, dh}, opt));
    if (op == "softmax")
      run = [=] { return seqrec::ops::causal_softmax_attention(q, k, v, pad, 0.0, true); };
    else if (op == "linrec")
      run = [=] {
        return seqrec::ops::linrec_attention(q, k, v, pad, seqrec::ops::LinrecNorm::kPaper,
                                             seqrec::ops::LinrecForm::kCausal);
      };
    else if (op == "linrec:global")
      run = [=] {
        return seqrec::ops::linrec_attention(q, k, v, pad, seqrec::ops::LinrecNorm::kPaper,
                                             seqrec::ops::LinrecForm::kGlobal);
      };
    else if (op == "linear")
      run = [=] { return seqrec::ops::causal_linear_attention(q, k, v, 64); };
    else if (op == "linear:global")
      run = [=] { return seqrec::ops::global_linear_attention(q, k, v); };
    else if (op == "linear:global:reference")
      run = [=] { return seqrec::ops::global_linear_attention_reference(q, k, v); };
    else
      run = [=] { return seqrec::ops::causal_linear_attention_reference(q, k, v, 64); };
  } else if (op == "linrec:packed") {
    auto qkv = leaf(torch::randn({B, len, 3 * dim}, opt));
    run = [=] {
      return seqrec::ops::linrec_attention_packed(qkv, heads, pad, seqrec::ops::LinrecNorm::kPaper,
                                                  seqrec::ops::LinrecForm::kGlobal);
    };
  } else if (op == "linrec:packed:bf16") {
    auto product = leaf(torch::randn({B, len, 3 * dim}, opt).to(torch::kBFloat16));
    auto bias = leaf(torch::randn({3 * dim}, opt));
    run = [=] {
      return seqrec::ops::linrec_attention_packed_bf16(product, bias, heads, pad, seqrec::ops::LinrecNorm::kPaper,
                                                       seqrec::ops::LinrecForm::kGlobal);
    };
  } else if (op == "lightsans" || op == "lightsans:reference") {
    // The item-to-interest branch (LightSANs-ape's whole attention): aggregate keys and values,
    // attend each slot's query over its interests (the fused op the model runs: the slot-by-slot
    // scan, on a CUDA device its kernel; lightsans:reference the ATen composition).
    auto q = leaf(torch::randn({B, heads, len, dh}, opt)), k = leaf(torch::randn({B, len, dim}, opt)),
         v = leaf(torch::randn({B, len, dim}, opt)), tk = leaf(torch::randn({dim, interests}, opt)),
         tv = leaf(torch::randn({dim, interests}, opt));
    if (op == "lightsans")
      run = [=] {
        return seqrec::ops::causal_interest_attention(q, k, v, torch::matmul(k, tk), torch::matmul(v, tv), pad, 0.0,
                                                      true);
      };
    else
      run = [=] {
        return seqrec::ops::interest_attention(
            q, seqrec::ops::causal_interest_aggregation(k, torch::matmul(k, tk), pad),
            seqrec::ops::causal_interest_aggregation(v, torch::matmul(v, tv), pad), 0.0, true);
      };
  } else if (op == "lisa" || op == "lisa:reference") {
    auto logits = leaf(torch::randn({B, len, codebooks, codewords}, opt));
    auto index = torch::randint(codewords, {B, len, codebooks}, opt.dtype(torch::kLong));
    auto table = leaf(torch::randn({codebooks, codewords, codewords}, opt));
    auto values = leaf(torch::randn({codebooks, codewords, dim}, opt));
    const auto fn = op == "lisa" ? &seqrec::ops::lisa_attention : &seqrec::ops::lisa_attention_reference;
    run = [=] { return fn(torch::softmax(logits, -1), index, pad, table, values, std::exp(-0.1)); };
  } else if (op == "routing" || op == "routing:reference") {
    // One routing head and one local head, as configs/ml-1m/routing.flags pairs them.
    const int64_t K = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(len))));
    const int64_t W = (len + K - 1) / K;
    auto r = leaf(torch::randn({B, 1, len, dh}, opt)), v = leaf(torch::randn({B, 1, len, dh}, opt));
    auto q = leaf(torch::randn({B, 1, len, dh}, opt)), k = leaf(torch::randn({B, 1, len, dh}, opt));
    auto mu = torch::randn({1, K, dh}, opt);
    mu = mu / mu.norm(2, -1, true);
    const auto attend = op == "routing" ? &seqrec::ops::routed_attention : &seqrec::ops::routed_attention_reference;
    run = [=] {
      auto unit = at::layer_norm(r, {dh}, {}, {}, 1e-6);
      auto plan = seqrec::ops::causal_balanced_routing(unit.detach(), mu, pad, W, W);
      auto routed = attend(unit, v, plan, pad, 1.0 / std::sqrt(static_cast<double>(dh)), 0.0, true);
      return torch::cat({routed, seqrec::ops::local_attention(q, k, v, pad, 2 * W, 0.0, true)}, 1);
    };
  } else if (op.rfind("gated:", 0) == 0) {
    auto q = leaf(torch::randn({B, 1, len, dim}, opt)), k = leaf(torch::randn({B, 1, len, dim}, opt)),
         v = leaf(torch::randn({B, 1, len, dim}, opt));
    seqrec::ops::GatedAttentionOptions go;
    std::string rest = op.substr(6);
    const bool reference = ends_with(rest, ":reference"), rows = ends_with(rest, ":rows");
    if (reference) rest.resize(rest.size() - 10);
    if (rows) rest.resize(rest.size() - 5);
    if (ends_with(rest, ":topk")) {  // FLASH4Rec's config: Top-K dropout of the top 10 at p 0.1
      rest.resize(rest.size() - 5);
      go.topk = 10;
      go.topk_dropout = 0.1;
    }
    go.form = seqrec::ops::parse_gated_attention_form(rest);
    go.causal = true;
    go.training = true;
    run = [=] {
      if (rows) return seqrec::ops::gated_attention_fused(q, k, v, pad, go);
      return reference ? seqrec::ops::gated_attention_reference(q, k, v, pad, go)
                       : seqrec::ops::gated_attention(q, k, v, pad, go);
    };
  } else if (op == "loss:softmax" || op == "loss:softmax:recompute" || op == "loss:softmax:reference" ||
             op == "loss:softmax:recompute:reference") {
    auto hidden = leaf(torch::randn({tokens, dim}, opt));
    auto table = leaf(torch::randn({items + 1, dim}, opt) * 0.1);
    auto targets = torch::randint(1, items + 1, {tokens}, opt.dtype(torch::kLong));
    const int64_t keep_bytes = op.find(":recompute") == std::string::npos ? int64_t{256} << 20 : 0;
    const bool reference = op.find(":reference") != std::string::npos;
    run = [=] {
      return reference ? seqrec::ops::softmax_loss_sum_reference(hidden, table, targets, 2048, keep_bytes)
                       : seqrec::ops::softmax_loss_sum(hidden, table, targets, 2048, keep_bytes);
    };
  } else if (op.rfind("model:", 0) == 0) {
    seqrec::models::ModelOptions o;
    o.model = op.substr(6);
    if (o.model == "flash4rec:cosine") {
      // The O(L) path: Top-K dropout needs the explicit L x L matrix, so it is off here.
      o.model = "flash4rec";
      o.flash_attention = "cosine";
      o.topk_dropout = 0;
    }
    o.flash_user = "zero";  // no dataset here: a zero user vector keeps the gate's shape
    o.num_items = 3416;
    o.max_len = len;
    o.hidden = dim;
    o.heads = heads;
    o.blocks = 2;
    o.interests = interests;
    o.codebooks = codebooks;
    o.codewords = codewords;
    std::shared_ptr<seqrec::models::SequenceModel> m = seqrec::models::make_model(o);
    m->to(device);
    m->set_training(true);
    for (auto& [name, p] : m->named_parameters()) leaves.push_back(p);
    auto input = torch::randint(1, o.num_items + 1, {B, len}, opt.dtype(torch::kLong));
    run = [=] {
      auto h = m->encode(input);
      return torch::matmul(h.select(1, len - 1), m->item_embeddings().t()).logsumexp(-1);
    };
  } else {
    usage("unknown --op '" + op + "'");
  }
  const double base = status_mb("VmRSS:");
  if (on_gpu) seqrec::train::reset_device_peak(device);  // the peak restarts at what is allocated now
  const double device_base = on_gpu ? seqrec::train::device_peak_mib(device) : 0.0;
  auto sync = [&] {
    if (on_gpu) torch::cuda::synchronize(device.index());
  };
  std::vector<double> ms;
  for (int64_t i = 0; i <= iters; ++i) {  // the first pass warms up
    sync();
    auto t0 = std::chrono::steady_clock::now();
    auto out = run();
    out.sum().backward();
    sync();
    auto t1 = std::chrono::steady_clock::now();
    for (auto& l : leaves) l.mutable_grad() = at::Tensor();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double peak = on_gpu ? seqrec::train::device_peak_mib(device) - device_base : status_mb("VmHWM:") - base;
  std::printf("{\"op\":\"%s\",\"len\":%lld,\"batch\":%lld,\"dim\":%lld,\"heads\":%lld,\"threads\":%d,"
              "\"device\":\"%s\",\"ms\":%.2f,\"peak_mb\":%.1f}\n",
              op.c_str(), static_cast<long long>(len), static_cast<long long>(B), static_cast<long long>(dim),
              static_cast<long long>(heads), at::get_num_threads(), device.str().c_str(), ms[ms.size() / 2], peak);
  return 0;
}
