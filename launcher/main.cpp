// seqrec: the command-line entry point. Flags are defined only here, validated, and copied
// into the libraries' option structs; libraries never read a flag.
#include <dlfcn.h>
#include <gflags/gflags.h>
#include <unistd.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "launcher/allocator.h"
#include "io/build_info.h"
#include "io/dataset.h"
#include "io/log.h"
#include "io/prepare.h"
#include "launcher/flags.h"
#include "launcher/revision.h"
#include "models/model.h"
#include "ops/kernels.h"
#include "train/checkpoint.h"
#include "train/recommend.h"
#include "train/run_summary.h"
#include "train/trainer.h"

namespace seqrec {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

// Invalid flags and bad input end with a message naming the problem and this exit code.
constexpr int kUsageError = 2;
constexpr int kRuntimeError = 1;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

std::vector<std::string> split_list(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

train::EvalProtocol eval_protocol_from_flags() {
  train::EvalProtocol p;
  require(FLAGS_eval_protocol == "sampled" || FLAGS_eval_protocol == "full",
          "--eval_protocol must be 'sampled' or 'full', got '" + FLAGS_eval_protocol + "'");
  require(FLAGS_eval_sampler == "uniform" || FLAGS_eval_sampler == "popularity",
          "--eval_sampler must be 'uniform' or 'popularity', got '" + FLAGS_eval_sampler + "'");
  require(FLAGS_eval_negatives > 0, "--eval_negatives must be > 0, got " + std::to_string(FLAGS_eval_negatives));
  p.sampled = FLAGS_eval_protocol == "sampled";
  p.negatives = FLAGS_eval_negatives;
  p.popularity = FLAGS_eval_sampler == "popularity";
  p.exclude_history = FLAGS_exclude_history;
  return p;
}

train::EvalOptions eval_options_from_flags() {
  require(FLAGS_eval_batch > 0, "--eval_batch must be > 0");
  train::EvalOptions e;
  e.max_len = FLAGS_max_len;
  e.batch_users = FLAGS_eval_batch;
  e.seed = FLAGS_seed;
  return e;
}

int local_size_from_env() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v)) {
      const int n = std::atoi(s);
      if (n > 0) return n;
    }
  return 1;
}

void set_threads() {
  require(FLAGS_threads >= 0, "--threads must be >= 0 (0 = cores / ranks on this node)");
  int n = FLAGS_threads;
  if (n == 0) n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_size_from_env());
  at::set_num_threads(n);
  at::set_num_interop_threads(1);
  // OpenBLAS (pthread build) keeps its own thread pool sized to the machine, which Torch's
  // setting does not reach: unbounded, its idle threads spin against the ranks' own.
  using SetThreads = void (*)(int);
  for (const char* sym : {"openblas_set_num_threads", "goto_set_num_threads"})
    if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, sym))) {
      fn(n);
      break;
    }
}

int cmd_prepare() {
  require(!FLAGS_input.empty(), "--input is required");
  require(!FLAGS_out.empty(), "--out is required");
  require(FLAGS_shards > 0, "--shards must be > 0, got " + std::to_string(FLAGS_shards));
  require(FLAGS_kcore >= 0, "--kcore must be >= 0");
  require(FLAGS_delimiter.size() == 1 || FLAGS_delimiter == "\\t" || FLAGS_delimiter == "tab",
          "--delimiter must be one character (or 'tab'), got '" + FLAGS_delimiter + "'");
  io::PrepareOptions o;
  o.format = FLAGS_format;
  o.input = FLAGS_input;
  o.out = FLAGS_out;
  o.name = FLAGS_name;
  o.shards = FLAGS_shards;
  o.kcore = FLAGS_kcore;
  o.has_min_rating = !gflags::GetCommandLineFlagInfoOrDie("min_rating").is_default;
  o.min_rating = FLAGS_min_rating;
  o.behaviors = split_list(FLAGS_behaviors);
  o.columns = split_list(FLAGS_columns);
  o.delimiter = FLAGS_delimiter.size() == 1 ? FLAGS_delimiter[0] : '\t';
  o.header = FLAGS_header;
  o.user_features = FLAGS_user_features;
  o.user_id_map = FLAGS_user_id_map;
  o.progress = FLAGS_progress;
  auto meta = io::prepare_dataset(o);
  std::printf("%s", io::describe(meta).c_str());
  return 0;
}

int cmd_synth() {
  require(!FLAGS_out.empty(), "--out is required");
  require(FLAGS_users > 0 && FLAGS_items > 1 && FLAGS_events >= 3 * FLAGS_users,
          "--users > 0, --items > 1 and --events >= 3 * users are required");
  require(FLAGS_shards > 0, "--shards must be > 0");
  io::SynthOptions o;
  o.out = FLAGS_out;
  o.users = FLAGS_users;
  o.items = FLAGS_items;
  o.events = FLAGS_events;
  o.seed = FLAGS_seed;
  o.shards = FLAGS_shards;
  o.clusters = FLAGS_clusters;
  o.progress = FLAGS_progress;
  auto meta = io::synth_dataset(o);
  std::printf("%s", io::describe(meta).c_str());
  return 0;
}

models::ModelOptions model_options_from_flags() {
  if (auto problem = model_flags_problem(FLAGS_model); !problem.empty()) throw UsageError(problem);
  models::ModelOptions m;
  // Every option of the model table has a flag of the same name, so the flags are read
  // through the table; a flag whose default disagrees with ModelOptions' is a build defect
  // that every training run (and so every e2e test) reports.
  for (auto& opt : models::model_option_table()) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(opt.key.c_str(), &info))
      throw std::logic_error("model option --" + opt.key + " has no flag");
    models::ModelOptions d;
    models::set_model_option(d, opt.key, info.default_value);
    if (models::get_model_option(d, opt.key) != opt.default_text)
      throw std::logic_error("flag --" + opt.key + " defaults to " + info.default_value +
                             " but ModelOptions to " + opt.default_text);
    const std::string& value = info.current_value;
    try {
      models::set_model_option(m, opt.key, value);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  m.init_seed = FLAGS_seed;
  // Replaced by the dataset's values; placeholders here so that the other fields validate.
  m.num_items = 1;
  m.num_users = 1;
  m.user_feature_cardinalities = {1};
  try {
    models::validate(m);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("invalid model flags: ") + e.what());
  }
  return m;
}

int cmd_train(dist::Comm& comm) {
  require(!FLAGS_data.empty(), "--data is required");
  require(!FLAGS_out.empty(), "--out is required");
  require(FLAGS_max_len > 0, "--max_len must be > 0, got " + std::to_string(FLAGS_max_len));
  require(FLAGS_batch_size > 0, "--batch_size must be > 0, got " + std::to_string(FLAGS_batch_size));
  require(FLAGS_lr > 0, "--lr must be > 0, got " + std::to_string(FLAGS_lr));
  require(FLAGS_beta1 >= 0 && FLAGS_beta1 < 1 && FLAGS_beta2 >= 0 && FLAGS_beta2 < 1, "--beta1/--beta2 must be in [0, 1)");
  require(FLAGS_weight_decay >= 0, "--weight_decay must be >= 0");
  require(FLAGS_weight_decay_mode == "l2" || FLAGS_weight_decay_mode == "decoupled",
          "--weight_decay_mode must be l2 or decoupled, got '" + FLAGS_weight_decay_mode + "'");
  require(FLAGS_weight_decay_mode == "l2" || FLAGS_weight_decay > 0,
          "--weight_decay_mode decoupled decays nothing at --weight_decay 0: give the decay rate too");
  require(FLAGS_adam_eps > 0, "--adam_eps must be > 0");
  require(FLAGS_clip_norm >= 0, "--clip_norm must be >= 0 (0 = off)");
  require(FLAGS_epochs > 0, "--epochs must be > 0");
  require(FLAGS_eval_every > 0, "--eval_every must be > 0");
  require(FLAGS_patience >= 0, "--patience must be >= 0 (0 = no early stopping)");
  require(FLAGS_loss == "bce" || FLAGS_loss == "ce" || FLAGS_loss == "sampled",
          "--loss must be 'bce', 'ce' or 'sampled', got '" + FLAGS_loss + "'");
  // Set away from its default, not merely set: a run's flags.txt names every flag at its value.
  for (const char* flag : {"loss_negatives", "loss_sampler"}) {
    const auto info = gflags::GetCommandLineFlagInfoOrDie(flag);
    require(FLAGS_loss == "sampled" || info.current_value == info.default_value,
            std::string("--") + flag + " applies to --loss sampled only (this run: --loss " + FLAGS_loss + ")");
  }
  require(FLAGS_loss_negatives >= 1, "--loss_negatives must be >= 1, got " + std::to_string(FLAGS_loss_negatives));
  require(FLAGS_loss_sampler == "uniform" || FLAGS_loss_sampler == "popularity",
          "--loss_sampler must be 'uniform' or 'popularity', got '" + FLAGS_loss_sampler + "'");
  require(FLAGS_label_smoothing >= 0 && FLAGS_label_smoothing < 1,
          "--label_smoothing must be in [0, 1), got " + std::to_string(FLAGS_label_smoothing));
  require(FLAGS_label_smoothing == 0 || FLAGS_loss == "ce",
          "--label_smoothing applies to --loss ce only (this run: --loss " + FLAGS_loss + ")");
  require(FLAGS_keep_checkpoints > 0, "--keep_checkpoints must be > 0");
  require(FLAGS_mask_prob > 0 && FLAGS_mask_prob < 1, "--mask_prob must be in (0, 1)");
  require(FLAGS_replica_check_every >= 0, "--replica_check_every must be >= 0");
  require(FLAGS_expert_parallel >= 1, "--expert_parallel must be >= 1");
  require(FLAGS_checkpoint_every >= 0 && FLAGS_max_steps >= 0 && FLAGS_warmup_steps >= 0,
          "--checkpoint_every, --max_steps and --warmup_steps must be >= 0");
  try {  // the schedule's own rules, before anything is written (its length needs the data: the
         // decay's end is left 0 and its start given in epochs, whose sign and zero are the steps')
    train::LrSchedule{FLAGS_lr, FLAGS_warmup_steps, FLAGS_lr_schedule, FLAGS_lr_final_ratio, 0, FLAGS_lr_decay_from_epoch}
        .validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::set<std::string> metrics = {"HR@5", "HR@10", "HR@20", "NDCG@5", "NDCG@10", "NDCG@20",
                                         "MRR@5", "MRR@10", "MRR@20", "MRR"};
  require(metrics.count(FLAGS_select_metric), "--select_metric must be one of HR@k, NDCG@k, MRR@k (k = 5, 10, 20) or MRR; got '" + FLAGS_select_metric + "'");
  train::TrainOptions o;
  o.data = FLAGS_data;
  o.out = FLAGS_out;
  o.allocator = allocator_description();
  o.model = model_options_from_flags();
  o.loader.max_len = FLAGS_max_len;
  require(!(FLAGS_train_windows && FLAGS_train_prefixes), "--train_windows and --train_prefixes exclude each other");
  o.loader.windows = FLAGS_train_windows;
  o.loader.prefixes = FLAGS_train_prefixes;
  o.loader.batch_size = FLAGS_batch_size;
  o.loader.seed = FLAGS_seed;
  o.loader.prefetch = FLAGS_prefetch;
  o.device = FLAGS_device;
  o.loss = FLAGS_loss;
  o.loss_negatives = FLAGS_loss_negatives;
  o.loss_sampler = FLAGS_loss_sampler;
  o.label_smoothing = FLAGS_label_smoothing;
  o.adam.lr = FLAGS_lr;
  o.adam.beta1 = FLAGS_beta1;
  o.adam.beta2 = FLAGS_beta2;
  o.adam.weight_decay = FLAGS_weight_decay;
  o.adam.decoupled = FLAGS_weight_decay_mode == "decoupled";
  o.adam.eps = FLAGS_adam_eps;
  o.clip_norm = FLAGS_clip_norm;
  require(FLAGS_length_groups >= 0, "--length_groups must be >= 0 (0: 8 on the CPU, 1 on a CUDA device)");
  o.length_groups = FLAGS_length_groups;
  require(FLAGS_softmax_keep_mib >= 0, "--softmax_keep_mib must be >= 0");
  o.softmax_keep_mib = FLAGS_softmax_keep_mib;
  require(FLAGS_profile_steps >= 0, "--profile_steps must be >= 0");
  require(FLAGS_profile_after >= 0, "--profile_after must be >= 0");
  o.profile_steps = FLAGS_profile_steps;
  o.profile_after = FLAGS_profile_after;
  o.warmup_steps = FLAGS_warmup_steps;
  o.lr_schedule = FLAGS_lr_schedule;
  o.lr_final_ratio = FLAGS_lr_final_ratio;
  o.lr_decay_from_epoch = FLAGS_lr_decay_from_epoch;
  o.epochs = FLAGS_epochs;
  o.eval_every = FLAGS_eval_every;
  o.patience = FLAGS_patience;
  o.select_metric = FLAGS_select_metric;
  o.select_protocol = eval_protocol_from_flags();
  o.also_full_ranking = FLAGS_full_ranking;
  o.eval = eval_options_from_flags();
  o.resume = FLAGS_resume;
  o.checkpoint_every = FLAGS_checkpoint_every;
  o.keep_checkpoints = FLAGS_keep_checkpoints;
  o.mask_prob = FLAGS_mask_prob;
  o.replica_check_every = FLAGS_replica_check_every;
  o.expert_parallel = FLAGS_expert_parallel;
  o.max_steps = FLAGS_max_steps;
  o.final_test = FLAGS_final_test;
  o.log_every_seconds = FLAGS_log_every;
  o.seed = FLAGS_seed;
  o.config_text = effective_flags_text("train");
  o.stop_requested = [] { return g_stop.load(); };
  train::run_training(o, comm);
  return 0;
}

int cmd_eval(dist::Comm& comm) {
  require(!FLAGS_checkpoint.empty(), "--checkpoint is required");
  // Without --data, run_evaluation takes the dataset the checkpoint records.
  require(FLAGS_split == "valid" || FLAGS_split == "test", "--split must be 'valid' or 'test', got '" + FLAGS_split + "'");
  train::run_evaluation(FLAGS_checkpoint, FLAGS_data, FLAGS_split == "valid" ? train::Split::kValid : train::Split::kTest,
                        eval_protocol_from_flags(), eval_options_from_flags(), comm, FLAGS_device);
  return 0;
}

int cmd_recommend(dist::Comm& comm) {
  require(!FLAGS_checkpoint.empty(), "--checkpoint is required");
  require(FLAGS_top_k > 0, "--top_k must be > 0, got " + std::to_string(FLAGS_top_k));
  require(FLAGS_eval_batch > 0, "--eval_batch must be > 0");
  train::RecommendOptions o;
  o.checkpoint = FLAGS_checkpoint;
  o.data = FLAGS_data;
  o.users = split_list(FLAGS_user_ids);
  o.history = split_list(FLAGS_history);
  require(!(o.users.size() && o.history.size()), "--user_ids and --history exclude each other");
  require(FLAGS_history.empty() || !o.history.empty(), "--history names no item");
  require(FLAGS_user_ids.empty() || !o.users.empty(), "--user_ids names no user");
  o.k = FLAGS_top_k;
  o.exclude_history = FLAGS_exclude_history;
  o.batch_users = FLAGS_eval_batch;
  o.out = FLAGS_out;
  o.device = FLAGS_device;
  o.stop_requested = [] { return g_stop.load(); };
  train::run_recommend(o, comm);
  return 0;
}

int cmd_info(const std::vector<std::string>& positional) {
  if (positional.size() > 1) {
    // Several run directories: side by side.
    for (const auto& p : positional)
      require(train::is_run_directory(p), "'" + p + "' is not a run directory (no train.log or metrics.jsonl); "
                                          "several paths are compared as runs");
    const auto metrics = split_list(FLAGS_metrics);
    require(!metrics.empty(), "--metrics names no metric");
    // A run written before a flag existed ran at that flag's default.
    std::map<std::string, std::string> defaults;
    std::vector<gflags::CommandLineFlagInfo> all;
    gflags::GetAllFlags(&all);
    for (const auto& f : all) defaults[f.name] = f.default_value;
    std::printf("%s", train::compare_runs(positional, metrics, defaults).c_str());
    if (FLAGS_curves) std::printf("\n%s", train::compare_curves(positional).c_str());
    return 0;
  }
  std::string path = !positional.empty() ? positional[0] : (!FLAGS_data.empty() ? FLAGS_data : FLAGS_checkpoint);
  require(!path.empty(), "give a dataset directory or a checkpoint directory (positional, --data or --checkpoint)");
  namespace fs = std::filesystem;
  require(fs::exists(path), "no such file or directory: '" + path + "'");
  // A dataset's meta.h5 named itself stands for its dataset; any other file is none of the three.
  if (!fs::is_directory(path) && fs::path(path).filename() == "meta.h5") path = fs::path(path).parent_path().string();
  if (path.empty()) path = ".";
  require(fs::is_directory(path), "'" + path +
                                      "' is a file; give a dataset directory (meta.h5), a run directory (train.log) "
                                      "or a checkpoint directory (MANIFEST)");
  require(!FLAGS_curves || train::is_run_directory(path),
          "--curves applies to run directories (train.log or metrics.jsonl); '" + path + "' is not one");
  if (fs::exists(fs::path(path) / "meta.h5")) {
    std::printf("%s", io::describe(io::read_meta(path)).c_str());
    return 0;
  }
  std::string dir = path;
  // A run directory: its results first, then its newest checkpoint.
  const bool run = train::is_run_directory(path);
  if (run) std::printf("%s\n", train::describe_run(path).c_str());
  if (run && FLAGS_curves) std::printf("%s\n", train::compare_curves({path}).c_str());
  if (!fs::exists(fs::path(path) / "MANIFEST")) {
    // A run directory or a checkpoints directory: show its newest complete checkpoint.
    auto comm = dist::make_local_comm();
    for (const std::string sub : {"", "/checkpoints", "/best"}) {
      train::CheckpointManager mgr({path + sub, 1}, *comm);
      if (auto latest = mgr.latest()) {
        dir = *latest;
        break;
      }
    }
  }
  if (run && !fs::exists(fs::path(dir) / "MANIFEST")) {
    std::printf("checkpoint: none complete in %s/checkpoints\n", path.c_str());
    return 0;
  }
  require(fs::exists(fs::path(dir) / "MANIFEST"),
          "'" + path + "' is neither a dataset (meta.h5), a run directory (train.log) nor a checkpoint");
  train::verify_checkpoint(dir);
  auto bundle = train::read_bundle_file(dir + "/shared.bin");
  std::printf("checkpoint: %s\n", dir.c_str());
  for (auto& [k, v] : bundle.meta) {
    if (k == "config" || k == "model_signature") continue;
    std::printf("  %s: %s\n", k.c_str(), v.c_str());
  }
  if (bundle.meta.count("model_signature")) {
    std::printf("model:\n");
    for (auto& line : split_list(bundle.value("model_signature"), '\n')) std::printf("  %s\n", line.c_str());
    const auto mo = models::parse_model_signature(bundle.value("model_signature"));
    if (const double ratio = models::compression_ratio(mo); ratio > 0)
      std::printf("  compression: item table %.2fx smaller as codeword indices + codebooks "
                  "(4ND / sum over codebook sets of N B log2(W)/8 + 4BWD)\n", ratio);
  }
  int64_t n = 0, bytes = 0;
  for (auto& [name, t] : bundle.tensors)
    if (name.rfind("param/", 0) == 0) {
      n += t.numel();
      bytes += t.numel() * t.element_size();
    }
  std::printf("parameters: %lld (%.2f MiB)\n", static_cast<long long>(n), bytes / 1048576.0);
  if (bundle.meta.count("config")) std::printf("config:\n%s", bundle.value("config").c_str());
  return 0;
}

}  // namespace
}  // namespace seqrec

int main(int argc, char** argv) {
  using namespace seqrec;
  io::set_build_revision(built_revision());
  // OpenMP threads that spin after a parallel region take the core from OpenBLAS's own
  // threads (2.5x slower SASRec epochs at --threads 2 here). The OpenMP runtime reads its
  // wait policy when it is loaded, before main, so set it and start again once.
  bool restart = false;
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    restart = true;
  }
  // OpenBLAS picks its kernels from the CPU model; on virtual machines whose CPUID model it
  // does not know (these VMs) it falls back to SSE3 "Prescott" kernels, 8-10x slower GEMMs
  // than the AVX-512 ones the CPU runs (docs/benchmarks.md). Name the kernel family from the
  // CPU's features unless the user chose one; OpenBLAS reads it when it loads, so restart too.
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    const char* core = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      core = "Haswell";
    if (core) {
      setenv("OPENBLAS_CORETYPE", core, 1);
      restart = true;
    }
  }
  if (restart) execv("/proc/self/exe", argv);  // on failure, carry on with the defaults

  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_usage(argc >= 3 ? argv[2] : "");
    return argc < 2 ? kUsageError : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    if (argc > 2) {
      std::fprintf(stderr, "seqrec %s: takes no arguments, got '%s'\n", cmd.c_str(), argv[2]);
      return kUsageError;
    }
    std::printf("%s\n", io::describe_build().c_str());
    if (io::build_info().cuda) std::printf("CUDA devices visible: %d\n", static_cast<int>(torch::cuda::device_count()));
    return 0;
  }
  if (!is_subcommand(cmd)) {
    std::fprintf(stderr, "seqrec: unknown subcommand '%s'\n", cmd.c_str());
    print_usage("");
    return kUsageError;
  }
  std::vector<char*> args{argv[0]};
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "-help" || a == "--helpfull") {
      print_usage(cmd);
      return 0;
    }
    args.push_back(argv[i]);
  }
  for (int i = 2; i < argc; ++i) {  // --flagfile FILE or --flagfile=FILE, before gflags reads them
    const std::string a = argv[i];
    std::string file;
    for (const char* name : {"--flagfile", "-flagfile"}) {
      if (a == name && i + 1 < argc) file = argv[i + 1];
      if (a.rfind(std::string(name) + "=", 0) == 0) file = a.substr(std::string(name).size() + 1);
    }
    if (file.empty()) continue;
    if (auto problem = flagfile_problem(file); !problem.empty()) {
      std::fprintf(stderr, "seqrec %s: %s\n", cmd.c_str(), problem.c_str());
      return kUsageError;
    }
  }
  int n = static_cast<int>(args.size());
  char** av = args.data();
  gflags::SetUsageMessage("seqrec " + cmd + " [flags]; seqrec " + cmd + " --help lists them");
  gflags::ParseCommandLineFlags(&n, &av, /*remove_flags=*/true);
  std::vector<std::string> positional(av + 1, av + n);

  try {
    check_flags_apply(cmd);
    try {
      configure_allocator(FLAGS_host_allocator);
      ops::set_matmul_precision(FLAGS_matmul_precision);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (cmd != "info") require(positional.empty(), "unexpected argument '" + (positional.empty() ? "" : positional[0]) + "'");
    set_threads();
    if (cmd == "prepare") return cmd_prepare();
    if (cmd == "synth") return cmd_synth();
    if (cmd == "info") return cmd_info(positional);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGUSR1, on_signal);
    std::signal(SIGINT, on_signal);
    auto comm = dist::make_comm(FLAGS_comm);
    ops::set_fused_kernels(FLAGS_fused_kernels);
    try {
      if (cmd == "train") return cmd_train(*comm);
      if (cmd == "eval") return cmd_eval(*comm);
      if (cmd == "recommend") return cmd_recommend(*comm);
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      // Every rank that fails reports; a failure on some ranks only must not leave the
      // others waiting in a collective.
      std::fprintf(stderr, "seqrec %s: error (rank %d): %s\n", cmd.c_str(), comm->rank(), e.what());
      std::fflush(stderr);
      if (comm->size() > 1) comm->abort(kRuntimeError);
      return kRuntimeError;
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "seqrec %s: %s\n", cmd.c_str(), e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seqrec %s: error: %s\n", cmd.c_str(), e.what());
    return kRuntimeError;
  }
  return 0;
}
