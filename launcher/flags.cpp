#include "launcher/flags.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <vector>

#include "models/model.h"

// Common
DEFINE_int32(threads, 0, "intra-op threads per rank; 0 = cores / ranks on this node");
DEFINE_string(device, "cpu",
              "train/eval: where the model runs: cpu | cuda | cuda:N (CUDA: one rank; the LibTorch must have CUDA)");
DEFINE_bool(fused_kernels, true,
            "train/eval: run the ops' fused kernels (on the CPU; on a CUDA device where one exists); false runs "
            "every op through its ATen reference, for checks and timing comparisons");
DEFINE_string(matmul_precision, "highest",
              "train/eval: float32 matrix products: highest (float32 throughout) | high (on a CUDA device, "
              "TensorFloat-32 tensor cores: inputs rounded to 10-bit mantissas, float32 sums; no effect on the CPU) | "
              "medium (on any device, the layers', attention's and loss's products on bfloat16 operands with float32 "
              "sums, results rounded to bfloat16; fast on CPUs with AVX-512 BF16)");
DEFINE_string(comm, "auto", "communication backend: auto (MPI under mpirun/srun), local, mpi");
DEFINE_uint64(seed, 42, "random seed (shuffling, negatives, initialisation, dropout, evaluation negatives)");
DEFINE_string(host_allocator, "caching",
              "host tensors of 256 KiB and more: caching (seqrec's allocator: reuses freed blocks, memory "
              "flat over long runs) | system (glibc malloc, as LibTorch by default)");
DEFINE_bool(progress, true, "print progress (rows/s, ETA) on stderr");
// prepare
DEFINE_string(format, "", "input format: sasrec | ml-1m | ml-25m | ml-20m | taobao | generic");
DEFINE_string(input, "", "raw interaction file (plain, .gz or .xz)");
DEFINE_string(out, "", "output: the dataset directory (prepare/synth), the run directory (train), the "
                       "recommendations' TSV file (recommend; empty: stdout)");
DEFINE_string(name, "", "dataset name (default: the input file's stem)");
DEFINE_int64(shards, 1, "number of HDF5 shards to write");
DEFINE_int32(kcore, 0, "iterative k-core filter on users and items; 0 = off");
DEFINE_double(min_rating, 0, "keep only rows with rating >= this (formats with ratings; unset = keep all)");
DEFINE_string(behaviors, "", "taobao: comma-separated behaviours to keep (pv,buy,cart,fav); empty = all");
DEFINE_string(columns, "user,item,time", "generic: column names in order (user,item,time,rating,ignore)");
DEFINE_string(delimiter, ",", "generic: field delimiter (one character, or 'tab')");
DEFINE_bool(header, false, "generic: the first line is a header");
DEFINE_string(user_features, "", "ML-1M users.dat to store as user features (gender, age, occupation, zip prefix)");
DEFINE_string(user_id_map, "", "'dataset_id original_id' lines joining --user_features to the input's user ids");
// synth
DEFINE_int64(users, 1000, "synth: number of users");
DEFINE_int64(items, 500, "synth: number of items");
DEFINE_int64(events, 50000, "synth: number of events in total");
DEFINE_int32(clusters, 0, "synth: item clusters with Markov transitions; 0 = sqrt(items)");
// train / eval
DEFINE_string(data, "", "dataset directory made by 'seqrec prepare' or 'seqrec synth' (eval, recommend: by default the "
                        "one the checkpoint was trained on)");
DEFINE_string(model, "sasrec", "model: sasrec | lisa | lightsans | linrec | routing | flash4rec");
DEFINE_int64(max_len, 200, "most recent items kept per sequence");
DEFINE_bool(train_windows, false,
            "train on every transition: each user's training history cut from the end into windows of "
            "max_len, one example each (false: only the most recent max_len per user and epoch)");
DEFINE_bool(train_prefixes, false,
            "train on every prefix of each user's training history as its own example, its most recent "
            "max_len transitions (RecBole's scheme: as many examples per epoch as transitions; not with "
            "--train_windows)");
DEFINE_int64(hidden, 50, "hidden size d");
DEFINE_int64(blocks, 2, "attention blocks");
DEFINE_int64(heads, 1, "attention heads");
DEFINE_double(dropout, 0.2, "dropout rate");
DEFINE_bool(norm_first, true, "pre-LN blocks (false: post-LN)");
DEFINE_int64(ffn_inner, 0, "FFN hidden width; 0 = --hidden");
DEFINE_string(ffn_activation, "relu", "FFN activation: relu | gelu");
DEFINE_string(objective, "causal",
              "causal (next item at every slot) | cloze (BERT4Rec-style masked items, bidirectional; "
              "sasrec, flash4rec and linrec) | last (each example scored at its last slot only, bidirectional "
              "within it: with --train_prefixes, how RecBole and the released LinRec code train; sasrec, "
              "flash4rec and linrec)");
DEFINE_string(attention_mask, "auto",
              "auto (what --objective implies) | causal (causal attention under --objective last too: each "
              "slot sees only earlier ones in every block, as RecBole trains SASRec; any model)");
DEFINE_double(mask_prob, 0.2, "cloze objective: probability that a training item is masked");
DEFINE_int64(interests, 20, "lightsans: latent interests k per layer");
DEFINE_string(lightsans_position, "decoupled",
              "lightsans: decoupled (position branch inside attention) | absolute (LightSANs-ape)");
DEFINE_string(linrec_norm, "paper", "linrec: paper (row-wise q, column-wise k) | code (per-token q and k)");
DEFINE_bool(linrec_pad_keys, false,
            "linrec: a row's padded slots, up to max_len, take part as keys and values (in the sums and the "
            "norms), as in the released code, which masks nothing; padded slots hold zeros, so they act as "
            "max_len - length copies of one learned key and value");
DEFINE_string(lisa_variant, "base", "lisa: base | soft | mini");
DEFINE_int64(codebooks, 8, "lisa: codebooks B encoding the sequence");
DEFINE_int64(codewords, 128, "lisa: codewords W per codebook");
DEFINE_int64(target_codebooks, 8, "lisa mini: codebooks of the separate target quantizer");
DEFINE_int64(target_codewords, 128, "lisa mini: codewords per target codebook");
DEFINE_double(lisa_temperature, 0.7, "lisa: softmax temperature of the codeword assignment");
DEFINE_double(lisa_decay, 0.1, "lisa: histogram decay rate, gamma = exp(-rate); 0 = plain counts");
DEFINE_double(lisa_commitment, 0.0, "lisa: inputs-optimize weight (||e - sg(x_hat)||^2 per item)");
DEFINE_string(codebook_update, "grad", "lisa: grad (back-propagation) | ema (moving averages, all-reduced)");
DEFINE_double(ema_decay, 0.99, "lisa: EMA decay of the codebook statistics");
DEFINE_int64(routing_heads, 1, "routing: heads that route by k-means (the other --heads attend locally)");
DEFINE_int64(routing_clusters, 0, "routing: k-means centroids K per routing head; 0 = round(sqrt(max_len))");
DEFINE_int64(routing_window, 0, "routing: keys W each cluster takes from the prefix; 0 = ceil(max_len / K)");
DEFINE_int64(routing_chunk, 0, "routing: slots per causal routing chunk S; 0 = routing window");
DEFINE_int64(local_window, 0, "routing: keys a local head sees (itself included); 0 = 2 x routing chunk");
DEFINE_double(routing_decay, 0.999, "routing: EMA decay of the centroid statistics (all-reduced)");
DEFINE_double(routing_commitment, 1e-4, "routing: weight of the commitment term ||r - sg(mu)||^2");
DEFINE_string(flash_unit, "gau", "flash4rec: gau (gated attention unit) | mhsa (softmax multi-head attention: "
              "the 'without gated attention' ablation)");
DEFINE_string(flash_attention, "softmax", "flash4rec: softmax | cosine (the O(L) '1 + cos' form)");
DEFINE_int64(flash_expansion, 2, "flash4rec: value/gate width e = expansion x hidden");
DEFINE_int64(flash_qk_dim, 0, "flash4rec: width s of the shared query/key base; 0 = min(128, e)");
DEFINE_string(flash_user, "features",
              "flash4rec: the gate's user input: features (the dataset's user features) | embedding (learned "
              "per user) | zero | none (item-only gate: the 'without user gate' ablation)");
DEFINE_int64(topk_dropout_k, 10, "flash4rec: Top-K attention dropout's k; 0 = off");
DEFINE_double(topk_dropout, 0.1, "flash4rec: Top-K attention dropout rate; 0 = off");
DEFINE_int64(moe_experts, 4, "flash4rec: experts per mixture-of-experts layer; 0 = dense FFN ('without MoE')");
DEFINE_int64(moe_top_k, 1, "flash4rec: experts per token");
DEFINE_double(capacity_factor, 1.25, "flash4rec: expert capacity = ceil(factor x top_k x tokens / experts); "
              "tokens over it skip the layer");
DEFINE_bool(moe_noise, true, "flash4rec: noisy top-k gating in training");
DEFINE_double(moe_balance, 0.01, "flash4rec: load-balancing loss weight");
DEFINE_string(loss, "bce",
              "bce (one sampled negative per position) | ce (softmax over all items) | sampled (softmax over the "
              "target and --loss_negatives items drawn per step, logQ-corrected: for catalogues too large for ce)");
DEFINE_int64(loss_negatives, 1000, "--loss sampled: items drawn per step (with replacement), shared by its targets");
DEFINE_string(loss_sampler, "uniform",
              "--loss sampled: how the items are drawn: uniform | popularity (in proportion to training count + 1)");
DEFINE_double(label_smoothing, 0.0,
              "--loss ce: the target's share of the softmax's label becomes 1 - eps and eps is spread evenly over "
              "every item (as torch's cross_entropy label_smoothing, the padding item taking no share); 0 = off");
DEFINE_double(lr, 1e-3, "Adam learning rate");
DEFINE_double(beta1, 0.9, "Adam beta1");
DEFINE_double(beta2, 0.98, "Adam beta2");
DEFINE_double(adam_eps, 1e-8, "Adam epsilon");
DEFINE_double(weight_decay, 0.0, "weight decay (see --weight_decay_mode); 0 = none");
DEFINE_string(weight_decay_mode, "l2",
              "l2: weight_decay x w added to every gradient (Adam's L2, as torch.optim.Adam) | decoupled: weight "
              "matrices and embeddings shrink by lr x weight_decay each step apart from the gradient moments "
              "(AdamW); biases and normalisation gains do not decay");
DEFINE_double(clip_norm, 0.0, "clip the global gradient norm to this; 0 = off");
DEFINE_int64(warmup_steps, 0, "linear learning-rate warm-up steps");
DEFINE_string(lr_schedule, "constant",
              "learning rate after the warm-up: constant, or decayed to --lr_final_ratio x --lr by the last "
              "planned step (--epochs x steps per epoch) along half a cosine (cosine) or a line (linear)");
DEFINE_double(lr_final_ratio, 0.0, "cosine/linear: the learning rate at the last planned step, as a fraction of --lr");
DEFINE_int64(lr_decay_from_epoch, 0,
             "cosine/linear: the epoch the decay begins, the rate held at --lr until then (0: at the warm-up's end); "
             "a constant-rate run resumes under a decay that begins at or after its step");
DEFINE_int64(epochs, 200, "training epochs");
DEFINE_int64(batch_size, 128, "sequences per rank per step (global batch = batch_size x ranks)");
DEFINE_int64(eval_every, 1, "validate every N epochs");
DEFINE_int64(patience, 0, "stop after N validations without improvement; 0 = off");
DEFINE_string(select_metric, "NDCG@10", "validation metric for model selection and early stopping");
DEFINE_string(eval_protocol, "sampled", "sampled (1 target + N negatives) | full (rank all items)");
DEFINE_int64(eval_negatives, 100, "negatives per user for the sampled protocol");
DEFINE_string(eval_sampler, "uniform", "sampled negatives: uniform | popularity");
DEFINE_bool(exclude_history, false,
            "full ranking: do not rank the user's history items (recommend: never recommend them)");
DEFINE_bool(full_ranking, true, "also report full-ranking metrics beside sampled ones");
DEFINE_int64(eval_batch, 64, "users scored per forward pass in evaluation (and by recommend)");
DEFINE_string(resume, "", "'auto' (newest complete checkpoint in --out), a checkpoint directory, or empty");
DEFINE_int64(checkpoint_every, 0, "also checkpoint every N steps; 0 = at each validation only");
DEFINE_int32(keep_checkpoints, 3, "complete checkpoints kept");
DEFINE_int32(expert_parallel, 1,
             "ranks per expert-parallel group: each holds 1/N of every mixture-of-experts layer's experts "
             "(divides the number of ranks and --moe_experts)");
DEFINE_int64(replica_check_every, 100,
             "steps between checks that every rank holds the same parameters and EMA buffers "
             "(also before each checkpoint); 0 = before checkpoints only");
DEFINE_int64(max_steps, 0, "stop after this many optimizer steps; 0 = no limit");
DEFINE_bool(final_test, true, "evaluate the validation-selected model on the test split at the end");
DEFINE_double(log_every, 10, "seconds between progress lines");
DEFINE_int64(length_groups, 0,
             "run each batch as this many length-sorted slices, each trimmed to its longest row (same result, "
             "less padding work; the slices share one forward, where only attention runs per slice, except "
             "LISA's, which run one by one; with --moe_experts the batch runs whole and only the gated "
             "attention unit slices it); 0 = 8 on the CPU, 1 on a CUDA device (where each slice's launches "
             "cost more than the padding saves)");
DEFINE_int64(softmax_keep_mib, 256,
             "--loss ce: keep a batch's softmax probabilities from the forward for the backward when they fit in "
             "this many MiB (one [targets x items] product fewer, about 5% off a FLASH4Rec step on ML-1M, for up "
             "to that much more memory); 0 = always recompute them chunk by chunk");
DEFINE_int64(profile_steps, 0,
             "profile this many training steps (after --profile_after warm-up steps of this sitting): each "
             "rank writes the time of every op and seqrec region to OUT/profile-rank<R>.txt, rank 0 logs "
             "the largest; 0 = off");
DEFINE_int64(profile_after, 5, "--profile_steps: training steps of this sitting to run before profiling");
DEFINE_int32(prefetch, 4, "batches prepared ahead by the loader thread; 0 = synchronous");
DEFINE_string(checkpoint, "",
              "eval/recommend/info: a checkpoint directory, a run's best/ or checkpoints/ directory");
DEFINE_string(user_ids, "",
              "recommend: the users to recommend for, comma-separated, by their ids in the raw input (synth "
              "data: 0-based); empty (and no --history): every user of the dataset");
DEFINE_string(history, "",
              "recommend: a user outside the dataset, as their items' raw ids comma-separated, oldest first "
              "(user features unknown)");
DEFINE_int64(top_k, 10, "recommend: items per user");
DEFINE_string(split, "test", "eval: valid | test");
DEFINE_string(metrics, "HR@10,NDCG@10",
              "info with two or more run directories: the test metrics to compare, comma-separated");
DEFINE_bool(curves, false,
            "info with run directories: also print their validation curves side by side (the selection metric at "
            "every validated epoch, with the difference of two runs)");

namespace seqrec {
namespace {

const std::vector<std::string> kCommon = {"threads", "host_allocator", "flagfile"};
const std::vector<std::string> kEvalFlags = {"eval_protocol", "eval_negatives", "eval_sampler",
                                             "exclude_history", "eval_batch", "seed"};

struct Subcommand {
  std::string summary;
  std::vector<std::string> flags;
};

// "train" takes every model option of models::model_option_table() between these.
std::vector<std::string> train_flags(std::vector<std::string> before, const std::vector<std::string>& after) {
  for (auto& opt : models::model_option_table()) before.push_back(opt.key);
  before.insert(before.end(), after.begin(), after.end());
  return before;
}

const std::map<std::string, Subcommand>& subcommands() {
  static const std::map<std::string, Subcommand> table = {
      {"prepare",
       {"raw interaction logs -> sharded HDF5 dataset directory",
        {"format", "input", "out", "name", "shards", "kcore", "min_rating", "behaviors", "columns", "delimiter",
         "header", "user_features", "user_id_map", "progress"}}},
      {"synth",
       {"deterministic synthetic dataset with learnable sequential structure",
        {"out", "users", "items", "events", "seed", "shards", "clusters", "progress"}}},
      {"train",
       {"train a model (data parallel under mpirun), validate, checkpoint, test the selected model",
        train_flags({"data", "out"}, {"mask_prob", "loss", "loss_negatives", "loss_sampler", "label_smoothing", "lr",
         "beta1", "beta2", "adam_eps", "weight_decay", "weight_decay_mode", "clip_norm", "warmup_steps", "lr_schedule", "lr_final_ratio",
         "lr_decay_from_epoch", "epochs", "batch_size",
         "train_windows", "train_prefixes", "eval_every",
         "patience", "select_metric", "eval_protocol", "eval_negatives", "eval_sampler", "exclude_history",
         "full_ranking", "eval_batch", "resume", "checkpoint_every", "keep_checkpoints", "expert_parallel", "replica_check_every", "max_steps",
         "final_test", "log_every", "prefetch", "length_groups", "softmax_keep_mib", "profile_steps",
         "profile_after", "seed", "device", "fused_kernels", "matmul_precision", "comm"})}},
      {"eval",
       {"evaluate a checkpoint on the valid or test split",
        {"checkpoint", "data", "split", "eval_protocol", "eval_negatives", "eval_sampler", "exclude_history",
         "eval_batch", "seed", "device", "fused_kernels", "matmul_precision", "comm"}}},
      {"recommend",
       {"top-k next items from a checkpoint for the dataset's users or a given history",
        {"checkpoint", "data", "user_ids", "history", "top_k", "exclude_history", "eval_batch", "out", "device",
         "fused_kernels", "matmul_precision", "comm"}}},
      {"info", {"print a dataset's or a checkpoint's metadata, a run directory's results and newest checkpoint, or several runs side by side", {"data", "checkpoint", "metrics", "curves"}}},
  };
  return table;
}

bool uses(const std::string& cmd, const std::string& flag) {
  const auto& f = subcommands().at(cmd).flags;
  return std::find(f.begin(), f.end(), flag) != f.end() ||
         std::find(kCommon.begin(), kCommon.end(), flag) != kCommon.end();
}

}  // namespace

bool is_subcommand(const std::string& cmd) { return subcommands().count(cmd) > 0; }

void print_usage(const std::string& cmd) {
  if (!is_subcommand(cmd)) {
    std::printf("usage: seqrec <subcommand> [--flags] [--flagfile=FILE]\n\nsubcommands:\n");
    for (auto& [name, sc] : subcommands()) std::printf("  %-8s %s\n", name.c_str(), sc.summary.c_str());
    std::printf("\n'seqrec <subcommand> --help' lists that subcommand's flags; 'seqrec --version' names the build\n"
                "(the git revision it was built from, LibTorch, CUDA, MPI, compiler).\n");
    return;
  }
  const auto& sc = subcommands().at(cmd);
  std::printf("usage: seqrec %s%s [flags]\n  %s\n\nflags:\n", cmd.c_str(),
              cmd == "info" ? " [DATASET | CHECKPOINT | RUN | RUN RUN...]" : "", sc.summary.c_str());
  std::vector<std::string> names = sc.flags;
  names.push_back("threads");
  names.push_back("host_allocator");
  for (auto& n : names) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(n.c_str(), &info)) continue;
    std::printf("  --%s (%s, default %s)\n      %s\n", n.c_str(), info.type.c_str(),
                info.default_value.empty() ? "\"\"" : info.default_value.c_str(), info.description.c_str());
  }
  std::printf("  --flagfile=FILE\n      read flags from FILE (one --flag=value per line)\n");
}

std::string model_flags_problem(const std::string& model) {
  // Variant options set away from their defaults for a model that does not read them would
  // otherwise be silently ignored.
  for (auto& opt : models::model_option_table()) {
    if (opt.models.empty()) continue;
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(opt.key.c_str(), &info) || info.current_value == info.default_value) continue;
    if (std::find(opt.models.begin(), opt.models.end(), model) == opt.models.end())
      return "--" + opt.key + " applies to --model " + opt.models.front() + " only (this run: --model " + model + ")";
  }
  return "";
}

void check_flags_apply(const std::string& cmd) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  for (auto& f : all) {
    if (f.is_default || f.filename.find("launcher/flags.cpp") == std::string::npos) continue;
    if (!uses(cmd, f.name))
      throw std::runtime_error("flag --" + f.name + " does not apply to 'seqrec " + cmd + "'");
  }
}

std::string effective_flags_text(const std::string& cmd) {
  // A flagfile as gflags reads it, so that the run can be repeated or continued from it.
  std::string out = "# the effective flags of 'seqrec " + cmd + "', a flagfile: repeat or continue the run with\n#   seqrec " +
                    cmd + " --flagfile RUN/flags.txt" + (cmd == "train" ? " --resume auto" : "") + "\n";
  std::vector<std::string> names = subcommands().at(cmd).flags;
  std::sort(names.begin(), names.end());
  for (auto& n : names) {
    std::string value;
    if (gflags::GetCommandLineOption(n.c_str(), &value)) out += "--" + n + "=" + value + "\n";
  }
  return out;
}

std::string flagfile_problem(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "--flagfile " + path + ": cannot be read (" + std::strerror(errno) + ")";
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#' || line[first] == '-') continue;
    // gflags would take such a line for a list of program names and skip every flag after it.
    return "--flagfile " + path + ", line " + std::to_string(n) + ": '" + line.substr(first) +
           "' is not a --flag=value line" +
           (line.find('=') != std::string::npos ? " (a run's flags.txt written before 2026-12-06 lists name=value: "
                                                  "prefix each line with --)"
                                                : "");
  }
  return "";
}

}  // namespace seqrec
