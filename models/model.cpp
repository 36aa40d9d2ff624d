// The model registry, option validation and model signatures.
#include "models/model.h"

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "models/backbone.h"

namespace seqrec::models {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<SequenceModel> (*make)(const ModelOptions&);
};
const std::vector<Entry>& registry() {
  static const std::vector<Entry> table = {
      {"sasrec", make_sasrec}, {"lisa", make_lisa}, {"lightsans", make_lightsans}, {"linrec", make_linrec}};
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
}

std::string model_signature(const ModelOptions& o) {
  std::ostringstream s;
  s.precision(17);
  s << "model=" << o.model << "\nnum_items=" << o.num_items << "\nmax_len=" << o.max_len
    << "\nhidden=" << o.hidden << "\nblocks=" << o.blocks << "\nheads=" << o.heads
    << "\ndropout=" << o.dropout << "\nnorm_first=" << (o.norm_first ? 1 : 0)
    << "\nlayer_norm_eps=" << o.layer_norm_eps << "\nffn_inner=" << o.ffn_inner
    << "\nffn_activation=" << o.ffn_activation << "\n";
  if (o.model == "lightsans")
    s << "interests=" << o.interests << "\nlightsans_position=" << o.lightsans_position << "\n";
  if (o.model == "linrec") s << "linrec_norm=" << o.linrec_norm << "\n";
  if (o.model == "lisa") {
    s << "lisa_variant=" << o.lisa_variant << "\ncodebooks=" << o.codebooks << "\ncodewords=" << o.codewords
      << "\nlisa_temperature=" << o.lisa_temperature << "\nlisa_decay=" << o.lisa_decay
      << "\nlisa_commitment=" << o.lisa_commitment << "\ncodebook_update=" << o.codebook_update << "\n";
    if (o.codebook_update == "ema") s << "ema_decay=" << o.ema_decay << "\n";
    if (o.lisa_variant == "mini")
      s << "target_codebooks=" << o.target_codebooks << "\ntarget_codewords=" << o.target_codewords << "\n";
  }
  return s.str();
}

ModelOptions parse_model_signature(const std::string& text) {
  ModelOptions o;
  for (auto& [k, v] : signature_fields(text)) {
    try {
      if (k == "model") o.model = v;
      else if (k == "num_items") o.num_items = std::stoll(v);
      else if (k == "max_len") o.max_len = std::stoll(v);
      else if (k == "hidden") o.hidden = std::stoll(v);
      else if (k == "blocks") o.blocks = std::stoll(v);
      else if (k == "heads") o.heads = std::stoll(v);
      else if (k == "dropout") o.dropout = std::stod(v);
      else if (k == "norm_first") o.norm_first = v == "1";
      else if (k == "layer_norm_eps") o.layer_norm_eps = std::stod(v);
      else if (k == "ffn_inner") o.ffn_inner = std::stoll(v);
      else if (k == "ffn_activation") o.ffn_activation = v;
      else if (k == "interests") o.interests = std::stoll(v);
      else if (k == "lightsans_position") o.lightsans_position = v;
      else if (k == "linrec_norm") o.linrec_norm = v;
      else if (k == "lisa_variant") o.lisa_variant = v;
      else if (k == "codebooks") o.codebooks = std::stoll(v);
      else if (k == "codewords") o.codewords = std::stoll(v);
      else if (k == "target_codebooks") o.target_codebooks = std::stoll(v);
      else if (k == "target_codewords") o.target_codewords = std::stoll(v);
      else if (k == "lisa_temperature") o.lisa_temperature = std::stod(v);
      else if (k == "lisa_decay") o.lisa_decay = std::stod(v);
      else if (k == "lisa_commitment") o.lisa_commitment = std::stod(v);
      else if (k == "codebook_update") o.codebook_update = v;
      else if (k == "ema_decay") o.ema_decay = std::stod(v);
      else throw std::invalid_argument("unknown key");
    } catch (const std::exception& e) {
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

std::unique_ptr<SequenceModel> make_model(const ModelOptions& o) {
  validate(o);
  for (auto& e : registry())
    if (o.model == e.name) return e.make(o);
  throw std::invalid_argument("unknown model '" + o.model + "'");
}

}  // namespace seqrec::models
