// The model registry, option validation and model signatures.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <variant>

#include "models/backbone.h"

namespace seqrec::models {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<SequenceModel> (*make)(const ModelOptions&, const ModelRuntime&);
};
// Models without run-time needs ignore the runtime.
template <std::unique_ptr<SequenceModel> (*F)(const ModelOptions&)>
std::unique_ptr<SequenceModel> plain(const ModelOptions& o, const ModelRuntime&) {
  return F(o);
}
const std::vector<Entry>& registry() {
  static const std::vector<Entry> table = {
      {"sasrec", plain<make_sasrec>}, {"lisa", plain<make_lisa>},       {"lightsans", plain<make_lightsans>},
      {"linrec", plain<make_linrec>}, {"routing", plain<make_routing>}, {"flash4rec", make_flash4rec}};
  return table;
}

std::map<std::string, std::string> signature_fields(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("model signature line without '=': " + line);
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

}  // namespace

std::vector<std::string> known_models() {
  std::vector<std::string> names;
  for (auto& e : registry()) names.push_back(e.name);
  return names;
}

void validate_flash4rec(const ModelOptions& o);

bool bidirectional(const ModelOptions& o) { return o.objective != "causal" && o.attention_mask != "causal"; }

void validate(const ModelOptions& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  bool known = false;
  for (auto& n : known_models()) known |= n == o.model;
  if (!known) {
    std::string list;
    for (auto& n : known_models()) list += (list.empty() ? "" : ", ") + n;
    fail("unknown model '" + o.model + "' (known: " + list + ")");
  }
  if (o.num_items <= 0) fail("num_items must be > 0, got " + std::to_string(o.num_items));
  if (o.max_len <= 0) fail("max_len must be > 0, got " + std::to_string(o.max_len));
  if (o.hidden <= 0) fail("hidden must be > 0, got " + std::to_string(o.hidden));
  if (o.blocks <= 0) fail("blocks must be > 0, got " + std::to_string(o.blocks));
  if (o.heads <= 0 || o.hidden % o.heads != 0)
    fail("heads must be > 0 and divide hidden (" + std::to_string(o.hidden) + "), got " +
         std::to_string(o.heads));
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("dropout must be in [0, 1), got " + std::to_string(o.dropout));
  if (o.ffn_inner < 0) fail("ffn_inner must be >= 0 (0 = hidden), got " + std::to_string(o.ffn_inner));
  if (o.ffn_activation != "relu" && o.ffn_activation != "gelu")
    fail("unknown ffn_activation '" + o.ffn_activation + "' (known: relu, gelu)");
  if (o.objective != "causal" && o.objective != "cloze" && o.objective != "last")
    fail("unknown objective '" + o.objective + "' (known: causal, cloze, last)");
  if (o.attention_mask != "auto" && o.attention_mask != "causal")
    fail("unknown attention_mask '" + o.attention_mask + "' (known: auto, causal)");
  if (o.objective == "cloze" && o.attention_mask == "causal")
    fail("attention_mask causal contradicts objective cloze: a masked slot is predicted from the items on both sides");
  if (bidirectional(o) && o.model != "sasrec" && o.model != "flash4rec" && o.model != "linrec")
    fail("objective " + o.objective + " needs bidirectional attention: model sasrec, flash4rec or linrec, not " +
         o.model + (o.objective == "last" ? " (or --attention_mask causal, which keeps every model causal)" : ""));
  if (o.model == "lightsans") {
    if (o.interests <= 0) fail("interests (LightSANs k) must be > 0, got " + std::to_string(o.interests));
    if (o.lightsans_position != "decoupled" && o.lightsans_position != "absolute")
      fail("unknown lightsans_position '" + o.lightsans_position + "' (known: decoupled, absolute)");
  }
  if (o.model == "lisa") {
    if (o.lisa_variant != "base" && o.lisa_variant != "soft" && o.lisa_variant != "mini")
      fail("unknown lisa_variant '" + o.lisa_variant + "' (known: base, soft, mini)");
    if (o.codebooks <= 0) fail("codebooks (LISA B) must be > 0, got " + std::to_string(o.codebooks));
    if (o.codewords <= 0) fail("codewords (LISA W) must be > 0, got " + std::to_string(o.codewords));
    if (o.lisa_variant == "mini" && o.target_codebooks <= 0)
      fail("target_codebooks must be > 0, got " + std::to_string(o.target_codebooks));
    if (o.lisa_variant == "mini" && o.target_codewords <= 0)
      fail("target_codewords must be > 0, got " + std::to_string(o.target_codewords));
    if (!(o.lisa_temperature > 0)) fail("lisa_temperature must be > 0, got " + std::to_string(o.lisa_temperature));
    if (!(o.lisa_decay >= 0)) fail("lisa_decay must be >= 0, got " + std::to_string(o.lisa_decay));
    if (!(o.lisa_commitment >= 0)) fail("lisa_commitment must be >= 0, got " + std::to_string(o.lisa_commitment));
    if (o.codebook_update != "grad" && o.codebook_update != "ema")
      fail("unknown codebook_update '" + o.codebook_update + "' (known: grad, ema)");
    if (!(o.ema_decay > 0 && o.ema_decay < 1)) fail("ema_decay must be in (0, 1), got " + std::to_string(o.ema_decay));
  }
  if (o.model == "linrec" && o.linrec_norm != "paper" && o.linrec_norm != "code")
    fail("unknown linrec_norm '" + o.linrec_norm + "' (known: paper, code)");
  if (o.model == "flash4rec") validate_flash4rec(o);
  if (o.model == "routing") {
    if (o.routing_heads < 1 || o.routing_heads > o.heads)
      fail("routing_heads must be in [1, heads = " + std::to_string(o.heads) + "], got " +
           std::to_string(o.routing_heads));
    if (o.routing_clusters < 0) fail("routing_clusters must be >= 0 (0 = sqrt(max_len)), got " + std::to_string(o.routing_clusters));
    if (o.routing_window < 0) fail("routing_window must be >= 0 (0 = max_len / clusters), got " + std::to_string(o.routing_window));
    if (o.routing_chunk < 0) fail("routing_chunk must be >= 0 (0 = routing_window), got " + std::to_string(o.routing_chunk));
    if (o.local_window < 0) fail("local_window must be >= 0 (0 = 2 routing_chunk), got " + std::to_string(o.local_window));
    if (!(o.routing_decay > 0 && o.routing_decay < 1))
      fail("routing_decay must be in (0, 1), got " + std::to_string(o.routing_decay));
    if (!(o.routing_commitment >= 0)) fail("routing_commitment must be >= 0, got " + std::to_string(o.routing_commitment));
  }
}

void validate_flash4rec(const ModelOptions& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (o.flash_unit != "gau" && o.flash_unit != "mhsa") fail("unknown flash_unit '" + o.flash_unit + "' (known: gau, mhsa)");
  if (o.flash_attention != "softmax" && o.flash_attention != "cosine")
    fail("unknown flash_attention '" + o.flash_attention + "' (known: softmax, cosine)");
  if (o.flash_expansion < 1) fail("flash_expansion must be >= 1, got " + std::to_string(o.flash_expansion));
  if (o.flash_qk_dim < 0) fail("flash_qk_dim must be >= 0 (0 = min(128, e)), got " + std::to_string(o.flash_qk_dim));
  if (o.flash_user != "features" && o.flash_user != "embedding" && o.flash_user != "zero" && o.flash_user != "none")
    fail("unknown flash_user '" + o.flash_user + "' (known: features, embedding, zero, none)");
  if (o.flash_user == "features" && o.user_feature_cardinalities.empty())
    fail("flash_user features: the dataset has no user features (prepare it with --user_features, or use "
         "--flash_user embedding|zero|none)");
  if (o.flash_user == "embedding" && o.num_users <= 0)
    fail("flash_user embedding needs the dataset's user count, got " + std::to_string(o.num_users));
  if (o.topk_dropout_k < 0) fail("topk_dropout_k must be >= 0, got " + std::to_string(o.topk_dropout_k));
  if (!(o.topk_dropout >= 0 && o.topk_dropout < 1)) fail("topk_dropout must be in [0, 1), got " + std::to_string(o.topk_dropout));
  if (o.moe_experts < 0) fail("moe_experts must be >= 0 (0 = dense FFN), got " + std::to_string(o.moe_experts));
  if (o.moe_experts > 0) {
    if (o.moe_top_k < 1 || o.moe_top_k > o.moe_experts)
      fail("moe_top_k must be in [1, moe_experts = " + std::to_string(o.moe_experts) + "], got " +
           std::to_string(o.moe_top_k));
    if (!(o.capacity_factor > 0)) fail("capacity_factor must be > 0, got " + std::to_string(o.capacity_factor));
    if (!(o.moe_balance >= 0)) fail("moe_balance must be >= 0, got " + std::to_string(o.moe_balance));
  }
}

RoutingSizes routing_sizes(const ModelOptions& o) {
  RoutingSizes r;
  r.clusters = o.routing_clusters > 0
                   ? o.routing_clusters
                   : std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(o.max_len))));
  r.window = o.routing_window > 0 ? o.routing_window : (o.max_len + r.clusters - 1) / r.clusters;
  r.chunk = o.routing_chunk > 0 ? o.routing_chunk : r.window;
  r.local_window = o.local_window > 0 ? o.local_window : 2 * r.chunk;
  return r;
}

namespace {

using Member = std::variant<int64_t ModelOptions::*, double ModelOptions::*, bool ModelOptions::*,
                            std::string ModelOptions::*, std::vector<int64_t> ModelOptions::*>;
struct Field {
  const char* key;
  std::vector<std::string> models;  // empty = every model
  Member member;
  // When set, the key is in a signature only where it has an effect (the key still parses).
  bool (*relevant)(const ModelOptions&) = nullptr;
  bool flag = true;  // false: set by the launcher from elsewhere (num_items from the dataset)
};

const std::vector<Field>& fields() {
  using O = ModelOptions;
  static const std::vector<Field> table = {
      {"model", {}, &O::model},
      {"num_items", {}, &O::num_items, nullptr, false},
      {"objective", {}, &O::objective, [](const O& o) { return o.objective != "causal"; }},
      {"attention_mask", {}, &O::attention_mask, [](const O& o) { return o.objective == "last"; }},
      {"num_users", {"flash4rec"}, &O::num_users, nullptr, false},
      {"user_feature_cardinalities", {"flash4rec"}, &O::user_feature_cardinalities, nullptr, false},
      {"max_len", {}, &O::max_len},
      {"hidden", {}, &O::hidden},
      {"blocks", {}, &O::blocks},
      {"heads", {}, &O::heads},
      {"dropout", {}, &O::dropout},
      {"norm_first", {}, &O::norm_first},
      {"layer_norm_eps", {}, &O::layer_norm_eps, nullptr, false},
      {"ffn_inner", {}, &O::ffn_inner},
      {"ffn_activation", {}, &O::ffn_activation},
      {"interests", {"lightsans"}, &O::interests},
      {"lightsans_position", {"lightsans"}, &O::lightsans_position},
      {"linrec_norm", {"linrec"}, &O::linrec_norm},
      {"linrec_pad_keys", {"linrec"}, &O::linrec_pad_keys, [](const O& o) { return o.linrec_pad_keys; }},
      {"lisa_variant", {"lisa"}, &O::lisa_variant},
      {"codebooks", {"lisa"}, &O::codebooks},
      {"codewords", {"lisa"}, &O::codewords},
      {"lisa_temperature", {"lisa"}, &O::lisa_temperature},
      {"lisa_decay", {"lisa"}, &O::lisa_decay},
      {"lisa_commitment", {"lisa"}, &O::lisa_commitment},
      {"codebook_update", {"lisa"}, &O::codebook_update},
      {"ema_decay", {"lisa"}, &O::ema_decay, [](const O& o) { return o.codebook_update == "ema"; }},
      {"target_codebooks", {"lisa"}, &O::target_codebooks, [](const O& o) { return o.lisa_variant == "mini"; }},
      {"target_codewords", {"lisa"}, &O::target_codewords, [](const O& o) { return o.lisa_variant == "mini"; }},
      {"routing_heads", {"routing"}, &O::routing_heads},
      {"routing_clusters", {"routing"}, &O::routing_clusters},
      {"routing_window", {"routing"}, &O::routing_window},
      {"routing_chunk", {"routing"}, &O::routing_chunk},
      {"local_window", {"routing"}, &O::local_window},
      {"routing_decay", {"routing"}, &O::routing_decay},
      {"routing_commitment", {"routing"}, &O::routing_commitment},
      {"flash_unit", {"flash4rec"}, &O::flash_unit},
      {"flash_attention", {"flash4rec"}, &O::flash_attention},
      {"flash_expansion", {"flash4rec"}, &O::flash_expansion},
      {"flash_qk_dim", {"flash4rec"}, &O::flash_qk_dim},
      {"flash_user", {"flash4rec"}, &O::flash_user},
      {"topk_dropout_k", {"flash4rec"}, &O::topk_dropout_k},
      {"topk_dropout", {"flash4rec"}, &O::topk_dropout},
      {"moe_experts", {"flash4rec"}, &O::moe_experts},
      {"moe_top_k", {"flash4rec"}, &O::moe_top_k},
      {"capacity_factor", {"flash4rec"}, &O::capacity_factor},
      {"moe_noise", {"flash4rec"}, &O::moe_noise},
      {"moe_balance", {"flash4rec"}, &O::moe_balance},
  };
  return table;
}

const Field& field(const std::string& key) {
  for (auto& f : fields())
    if (key == f.key) return f;
  throw std::invalid_argument("unknown model option '" + key + "'");
}

bool applies(const Field& f, const ModelOptions& o) {
  return (f.models.empty() || std::find(f.models.begin(), f.models.end(), o.model) != f.models.end()) &&
         (!f.relevant || f.relevant(o));
}

}  // namespace

const std::vector<ModelOptionInfo>& model_option_table() {
  static const std::vector<ModelOptionInfo> table = [] {
    std::vector<ModelOptionInfo> out;
    const ModelOptions defaults;
    for (auto& f : fields())
      if (f.flag) out.push_back({f.key, f.models, get_model_option(defaults, f.key)});
    return out;
  }();
  return table;
}

void set_model_option(ModelOptions& o, const std::string& key, const std::string& value) {
  const Field& f = field(key);
  auto bad = [&] { return std::invalid_argument("model option " + key + ": bad value '" + value + "'"); };
  try {
    size_t used = 0;
    if (auto m = std::get_if<int64_t ModelOptions::*>(&f.member)) {
      o.*(*m) = std::stoll(value, &used);
    } else if (auto d = std::get_if<double ModelOptions::*>(&f.member)) {
      o.*(*d) = std::stod(value, &used);
    } else if (auto b = std::get_if<bool ModelOptions::*>(&f.member)) {
      if (value != "1" && value != "0" && value != "true" && value != "false") throw bad();
      o.*(*b) = value == "1" || value == "true";
      used = value.size();
    } else if (auto v = std::get_if<std::vector<int64_t> ModelOptions::*>(&f.member)) {
      std::vector<int64_t> out;  // "a,b,c"; "" = empty
      for (size_t at = 0; at < value.size();) {
        size_t n = 0;
        out.push_back(std::stoll(value.substr(at), &n));
        at += n;
        if (at < value.size() && value[at++] != ',') throw bad();
      }
      o.*(*v) = out;
      used = value.size();
    } else {
      o.*std::get<std::string ModelOptions::*>(f.member) = value;
      used = value.size();
    }
    if (used != value.size()) throw bad();
  } catch (const std::invalid_argument&) {
    throw bad();
  } catch (const std::out_of_range&) {
    throw bad();
  }
}

std::string get_model_option(const ModelOptions& o, const std::string& key) {
  const Field& f = field(key);
  std::ostringstream s;
  s.precision(17);
  if (auto m = std::get_if<int64_t ModelOptions::*>(&f.member)) s << o.*(*m);
  else if (auto d = std::get_if<double ModelOptions::*>(&f.member)) s << o.*(*d);
  else if (auto b = std::get_if<bool ModelOptions::*>(&f.member)) s << (o.*(*b) ? 1 : 0);
  else if (auto v = std::get_if<std::vector<int64_t> ModelOptions::*>(&f.member)) {
    for (size_t i = 0; i < (o.*(*v)).size(); ++i) s << (i ? "," : "") << (o.*(*v))[i];
  } else s << o.*std::get<std::string ModelOptions::*>(f.member);
  return s.str();
}

std::string model_signature(const ModelOptions& o) {
  std::string s;
  for (auto& f : fields())
    if (applies(f, o)) s += std::string(f.key) + "=" + get_model_option(o, f.key) + "\n";
  return s;
}

std::string own_options_text(const ModelOptions& o) {
  std::string s;
  for (auto& f : fields()) {
    if (!f.flag || f.models.empty() || !applies(f, o)) continue;
    // As a user writes them: booleans as true/false, doubles to 6 digits (signatures keep 17).
    std::ostringstream v;
    if (auto b = std::get_if<bool ModelOptions::*>(&f.member)) v << (o.*(*b) ? "true" : "false");
    else if (auto d = std::get_if<double ModelOptions::*>(&f.member)) v << o.*(*d);
    else v << get_model_option(o, f.key);
    s += (s.empty() ? "" : " ") + std::string(f.key) + "=" + v.str();
  }
  return s;
}

ModelOptions parse_model_signature(const std::string& text) {
  ModelOptions o;
  for (auto& [k, v] : signature_fields(text)) {
    try {
      set_model_option(o, k, v);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument("model signature: bad entry '" + k + "=" + v + "'");
    }
  }
  return o;
}

std::string signature_difference(const std::string& a, const std::string& b) {
  auto fa = signature_fields(model_signature(parse_model_signature(a)));
  auto fb = signature_fields(model_signature(parse_model_signature(b)));
  std::string diff;
  for (auto& [k, v] : fa) {
    auto it = fb.find(k);
    const std::string w = it == fb.end() ? "(absent)" : it->second;
    if (w != v) diff += k + ": " + v + " vs " + w + "\n";
  }
  for (auto& [k, v] : fb)
    if (!fa.count(k)) diff += k + ": (absent) vs " + v + "\n";
  return diff;
}

void SequenceModel::to(const at::Device& device) {
  if (!device.is_cpu())
    throw std::invalid_argument("model '" + options().model + "' cannot move to " + device.str());
}

void check_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users) {
  TORCH_CHECK(!inputs.empty(), "encode_slices needs at least one slice");
  TORCH_CHECK(users.empty() || users.size() == inputs.size(), "encode_slices: ", users.size(), " user inputs for ",
              inputs.size(), " slices");
}

at::Tensor SequenceModel::encode_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users,
                                        bool last_only) {
  check_slices(inputs, users);
  std::vector<at::Tensor> parts;
  for (size_t s = 0; s < inputs.size(); ++s) {
    const UserInput u = users.empty() ? UserInput{} : users[s];
    if (last_only) {
      parts.push_back(encode_last(inputs[s], u));
    } else {
      auto h = encode(inputs[s], u);
      parts.push_back(h.reshape({-1, h.size(-1)}));
    }
  }
  return cat_rows(parts);
}

at::Tensor cat_rows(const std::vector<at::Tensor>& parts) {
  return parts.empty() ? at::Tensor() : parts.size() == 1 ? parts[0] : torch::cat(parts);
}

std::unique_ptr<OnlineSession> SequenceModel::online_session() {
  throw std::invalid_argument("model '" + options().model + "' has no constant-size online state");
}

double compression_ratio(const ModelOptions& o) {
  if (o.model != "lisa" || o.lisa_variant == "soft") return 0.0;
  const double N = static_cast<double>(o.num_items), D = static_cast<double>(o.hidden);
  auto set_bytes = [&](double books, double words) { return N * books * std::log2(words) / 8.0 + 4.0 * books * words * D; };
  double bytes = set_bytes(o.codebooks, o.codewords);
  if (o.lisa_variant == "mini") bytes += set_bytes(o.target_codebooks, o.target_codewords);
  return 4.0 * N * D / bytes;
}

std::unique_ptr<SequenceModel> make_model(const ModelOptions& o, const ModelRuntime& runtime) {
  validate(o);
  for (auto& e : registry())
    if (o.model == e.name) return e.make(o, runtime);
  throw std::invalid_argument("unknown model '" + o.model + "'");
}

}  // namespace seqrec::models
