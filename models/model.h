#pragma once
// The model-facing contract the trainer codes against. Torch module classes stay inside
// models/*.cpp; this header needs only the Tensor type.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace seqrec::dist {
class Comm;
}

namespace seqrec::models {

struct ModelOptions {
  std::string model = "sasrec";
  int64_t num_items = 0;      // dense items 1..num_items; row 0 of the embedding is padding
  // Filled from the dataset for models that read users (FLASH4Rec's user-aware gate).
  int64_t num_users = 0;
  std::vector<int64_t> user_feature_cardinalities;  // per categorical feature; empty = none
  // causal: next-item prediction at every slot; cloze: BERT4Rec-style masked items with
  // bidirectional attention (one extra [mask] item row, id num_items + 1); last: the next item
  // at each example's last slot only, with bidirectional attention within the example.
  std::string objective = "causal";
  // auto: the attention the objective implies (causal under causal, bidirectional under cloze
  // and last); causal: causal under last too, as RecBole trains SASRec (every prefix an example,
  // scored at its last slot, each slot seeing only earlier ones in every block).
  std::string attention_mask = "auto";
  int64_t max_len = 200;
  int64_t hidden = 50;
  int64_t blocks = 2;
  int64_t heads = 1;
  double dropout = 0.2;       // embedding, attention-probability and FFN dropout
  bool norm_first = true;     // pre-LN blocks; false = post-LN
  double layer_norm_eps = 1e-8;
  int64_t ffn_inner = 0;      // FFN hidden width; 0 = hidden
  std::string ffn_activation = "relu";  // relu | gelu
  uint64_t init_seed = 0;     // parameter initialisation (identical on every rank)

  // lightsans
  int64_t interests = 20;                      // k latent interests per layer
  std::string lightsans_position = "decoupled";  // decoupled | absolute (LightSANs-ape)
  // linrec
  std::string linrec_norm = "paper";           // paper | code (see ops/linear_attention)
  bool linrec_pad_keys = false;  // padded slots, up to max_len, are keys and values (the released
                                 // code masks nothing); the slots a trimmed batch drops are counted
  // lisa
  std::string lisa_variant = "base";  // base | soft | mini
  int64_t codebooks = 8;              // B codebooks encoding the sequence
  int64_t codewords = 128;            // W codewords per codebook
  int64_t target_codebooks = 8;       // mini: the separate target codebooks
  int64_t target_codewords = 128;
  double lisa_temperature = 0.7;      // softmax temperature of the codeword assignment
  double lisa_decay = 0.1;            // histogram decay rate: gamma = exp(-lisa_decay); 0 = counts
  double lisa_commitment = 0.0;       // "inputs-optimize" weight: ||e - sg(x_hat)||^2 per item
  std::string codebook_update = "grad";  // grad (back-propagation) | ema (moving averages)
  double ema_decay = 0.99;
  // routing (Routing Transformer attention, causal; see ops/routing_attention)
  int64_t routing_heads = 1;         // heads that route by k-means; the other heads are local
  int64_t routing_clusters = 0;      // K centroids per routing head; 0 = round(sqrt(max_len))
  int64_t routing_window = 0;        // W keys each cluster takes; 0 = ceil(max_len / K)
  int64_t routing_chunk = 0;         // S slots per causal routing chunk; 0 = W
  int64_t local_window = 0;          // keys a local head sees (itself included); 0 = 2 S
  double routing_decay = 0.999;      // EMA decay of the centroid statistics
  double routing_commitment = 1e-4;  // weight of ||r - sg(mu)||^2 per routed item and head
  // flash4rec (FLASH4Rec slides + FLASH's gated attention unit; see models/flash4rec.cpp)
  std::string flash_unit = "gau";        // gau (gated attention unit) | mhsa ("w/o gated attention")
  std::string flash_attention = "softmax";  // softmax | cosine (the slides' O(L) "1 + cos" form)
  int64_t flash_expansion = 2;           // e = expansion x hidden: width of the value and gate
  int64_t flash_qk_dim = 0;              // s: width of the shared query/key base; 0 = min(128, e)
  std::string flash_user = "features";   // gate input: features | embedding (learned per user) |
                                         // zero (a zero vector) | none (item-only gate, "w/o user gate")
  int64_t topk_dropout_k = 10;           // Top-K attention dropout's k; 0 = off
  double topk_dropout = 0.1;             // its rate p; 0 = off ("w/o Top-K dropout")
  int64_t moe_experts = 4;               // E experts per block; 0 = dense FFN ("w/o MoE")
  int64_t moe_top_k = 1;                 // experts per token (the slides: top-1)
  double capacity_factor = 1.25;         // expert capacity = ceil(cf x k x tokens / E)
  bool moe_noise = true;                 // noisy gating in training
  double moe_balance = 0.01;             // load-balancing loss weight
};

// What a model needs from the run beyond its options: the communicators of the
// mixture-of-experts layers (FLASH4Rec). Absent = one process holding every expert.
struct ModelRuntime {
  dist::Comm* world = nullptr;         // the data-parallel world
  dist::Comm* expert_group = nullptr;  // this rank's expert-parallel group
  // FLASH4Rec's gated attention runs the rows of a batch in this many length-sorted groups, each
  // trimmed to its longest row (the trainer's --length_groups, for models it cannot slice
  // itself: a mixture of experts needs the whole batch in one forward). Not part of the model:
  // real slots get the same outputs at any value (Top-K dropout's random bits aside).
  int64_t attention_length_groups = 1;
};

// The routing sizes with the automatic (0) values resolved.
struct RoutingSizes {
  int64_t clusters, window, chunk, local_window;
};
RoutingSizes routing_sizes(const ModelOptions& options);

// The option table: every ModelOptions field a user sets, under one key that is both its
// launcher flag and its signature name, with the models that read it (empty: all models).
// The launcher reads each key's flag through this table and rejects a variant's option set
// away from its default under another --model; signatures list the keys of the run's model.
struct ModelOptionInfo {
  std::string key;
  std::vector<std::string> models;  // empty = every model
  std::string default_text;         // ModelOptions{}'s value as text (flags must agree)
};
const std::vector<ModelOptionInfo>& model_option_table();
// Sets one option from text ("true"/"false"/"1"/"0" for booleans); throws
// std::invalid_argument naming the key and value when either is bad.
void set_model_option(ModelOptions& options, const std::string& key, const std::string& value);
std::string get_model_option(const ModelOptions& options, const std::string& key);

// Model-affecting options as "key=value" lines (a variant's own keys only for that variant);
// stored in checkpoints and compared on load.
std::string model_signature(const ModelOptions& options);

// The options of the run's model alone (those of model_option_table() that name it, where they
// apply) as "key=value" separated by spaces, e.g. "linrec_norm=paper linrec_pad_keys=true";
// empty for a model with none. The trainer logs them with its setup.
std::string own_options_text(const ModelOptions& options);

// Inverse of model_signature (absent keys keep their defaults, so signatures written before a
// key existed still load); throws std::invalid_argument naming an unknown or bad key.
ModelOptions parse_model_signature(const std::string& text);
// "" when equal, else the differing keys as "key: a vs b" lines (compared after parsing, so
// an absent key equals its default).
std::string signature_difference(const std::string& a, const std::string& b);
// Validates options; throws std::invalid_argument naming the bad field.
void validate(const ModelOptions& options);
// Whether every slot attends to every real slot of its example: the cloze and last objectives,
// unless attention_mask is causal.
bool bidirectional(const ModelOptions& options);

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Who the rows of a batch belong to, for models that read it (FLASH4Rec's user-aware gate);
// models that do not ignore it.
struct UserInput {
  at::Tensor ids;       // [B] int64 dense user ids (0-based)
  at::Tensor features;  // [B, F] int64 feature codes (1..cardinality, 0 = unknown); undefined when none
};

// SequenceModel::encode_slices' arguments: at least one slice, and users empty or one entry per
// slice; throws c10::Error naming the mismatch.
void check_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users);

// Parts joined along dimension 0, as encode_slices joins its slices: the one part itself (no
// copy), an undefined tensor for none.
at::Tensor cat_rows(const std::vector<at::Tensor>& parts);

// The id of the cloze objective's [mask] item.
inline int64_t mask_item(const ModelOptions& o) { return o.num_items + 1; }

// Whether the model has mixture-of-experts layers (FLASH4Rec with --moe_experts > 0), the only
// layers --expert_parallel spreads over ranks.
inline bool has_moe(const ModelOptions& o) { return o.model == "flash4rec" && o.moe_experts > 0; }

// Incremental scoring of one user's growing history (LISA's online inference, §4.8): the state
// is O(codebooks x codewords) whatever the history length, and each push costs the same.
class OnlineSession {
 public:
  virtual ~OnlineSession() = default;
  // Appends `item` (1..num_items; anything else throws std::out_of_range naming it) and returns
  // the hidden state [D] that scores the next item: encode_last of the history so far.
  virtual at::Tensor push(int64_t item) = 0;
  virtual int64_t length() const = 0;
};

class SequenceModel {
 public:
  virtual ~SequenceModel() = default;
  // input [B, L] int64, left-padded with 0 -> hidden states [B, L, D]; padded slots are 0.
  // Under the cloze objective input may hold mask_item() and attention is bidirectional.
  virtual at::Tensor encode(const at::Tensor& input, const UserInput& users = {}) = 0;
  // Hidden state at the last slot only, [B, D] (what scoring the next item needs, and what the
  // last-slot objective trains). Models may skip work that does not reach the last slot; the
  // result equals encode(input).select(1, L - 1), in training with the same gradients and
  // dropout drawn from the same distribution.
  virtual at::Tensor encode_last(const at::Tensor& input, const UserInput& users = {}) {
    return encode(input, users).select(1, input.size(1) - 1);
  }
  // Several length slices of one batch in one call: inputs[s] [b_s, L_s] (left-padded, as for
  // encode), users[s] their rows' users (empty, or one entry per slice). Returns each slice's
  // encode() output flattened to [b_s·L_s, D] and laid end to end, [Σ b_s·L_s, D]; with last_only
  // each slice's encode_last(), [Σ b_s, D]. Equal to running the slices one by one (in training:
  // the same gradients, dropout drawn from the same distribution), which the default does; the
  // backbone runs its position-wise layers and projections once over every slice's slots.
  virtual at::Tensor encode_slices(const std::vector<at::Tensor>& inputs, const std::vector<UserInput>& users,
                                   bool last_only);
  // [num_items + 1, D] output item representations that hidden states are scored against
  // (never the cloze [mask] row).
  virtual at::Tensor item_embeddings() = 0;
  virtual NamedTensors named_parameters() = 0;
  // The parameters of mixture-of-experts experts (keys carry global expert ids): under expert
  // parallelism each rank holds only its share of them; empty for models without experts.
  virtual std::vector<std::string> expert_parameters() { return {}; }
  // State that is not trained by gradient but must be checkpointed (EMA statistics, ...).
  virtual NamedTensors named_buffers() = 0;
  virtual void set_training(bool on) = 0;
  // Moves every parameter and buffer (and any state kept beside them) to `device`; the model's
  // inputs must then live there too. The default accepts the CPU only (where models are built).
  virtual void to(const at::Device& device);
  // Where the parameters live (the default asks item_embeddings(), which may compute).
  virtual at::Device device() { return item_embeddings().device(); }
  // Statistics that must be summed across ranks before apply_statistics() updates the model
  // (LISA's EMA codebooks); fixed shapes, so every rank takes part even without a forward.
  virtual std::vector<at::Tensor> pending_statistics() { return {}; }
  virtual void apply_statistics() {}
  // Extra loss accumulated by the training forwards since the last call (a sum over items, to be
  // normalised like the main loss); undefined when the model has none.
  virtual at::Tensor take_auxiliary_loss() { return {}; }
  // A fresh online session (evaluation mode only); throws std::invalid_argument for models
  // without a constant-size state.
  virtual std::unique_ptr<OnlineSession> online_session();
  virtual const ModelOptions& options() const = 0;
  // One line on learned discrete state (LISA's codebook usage), logged with each evaluation;
  // empty for models without any.
  virtual std::string describe_state() { return {}; }
};

// LISA's item-table compression (the paper's Table 2): the float32 table, 4·N·D bytes, against
// codeword indices N·B·log2(W)/8 plus codebooks 4·B·W·D for every codebook set that encodes
// items (Base: one; Mini: the target set and the sequence set). 0 when the model does not
// compress its table (every other model, and LISA-Soft, which scores raw embeddings).
double compression_ratio(const ModelOptions& options);

// Throws std::invalid_argument for an unknown model name (listing the known ones).
std::unique_ptr<SequenceModel> make_model(const ModelOptions& options, const ModelRuntime& runtime = {});

std::vector<std::string> known_models();

}  // namespace seqrec::models
