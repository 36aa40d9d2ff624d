#pragma once
// All of seqrec's command-line flags (gflags), and which subcommand uses which.
#include <gflags/gflags.h>

#include <string>

DECLARE_int32(threads);
DECLARE_string(comm);
DECLARE_string(device);
DECLARE_bool(fused_kernels);
DECLARE_string(matmul_precision);
DECLARE_uint64(seed);
DECLARE_bool(progress);
// prepare
DECLARE_string(format);
DECLARE_string(input);
DECLARE_string(out);
DECLARE_string(name);
DECLARE_int64(shards);
DECLARE_int32(kcore);
DECLARE_double(min_rating);
DECLARE_string(behaviors);
DECLARE_string(columns);
DECLARE_string(delimiter);
DECLARE_bool(header);
DECLARE_string(user_features);
DECLARE_string(user_id_map);
// synth
DECLARE_int64(users);
DECLARE_int64(items);
DECLARE_int64(events);
DECLARE_int32(clusters);
// train / eval
DECLARE_string(data);
DECLARE_string(model);
// The model options (models::model_option_table()) are defined in flags.cpp and read
// through the table; only the ones the launcher uses directly are declared here.
DECLARE_int64(max_len);
DECLARE_bool(train_windows);
DECLARE_bool(train_prefixes);
DECLARE_string(loss);
DECLARE_int64(loss_negatives);
DECLARE_string(loss_sampler);
DECLARE_double(mask_prob);
DECLARE_double(lr);
DECLARE_double(beta1);
DECLARE_double(beta2);
DECLARE_double(adam_eps);
DECLARE_double(weight_decay);
DECLARE_double(label_smoothing);
DECLARE_string(weight_decay_mode);
DECLARE_double(clip_norm);
DECLARE_int64(warmup_steps);
DECLARE_string(lr_schedule);
DECLARE_double(lr_final_ratio);
DECLARE_int64(lr_decay_from_epoch);
DECLARE_int64(epochs);
DECLARE_int64(batch_size);
DECLARE_int64(eval_every);
DECLARE_int64(patience);
DECLARE_string(select_metric);
DECLARE_string(eval_protocol);
DECLARE_int64(eval_negatives);
DECLARE_string(eval_sampler);
DECLARE_bool(exclude_history);
DECLARE_bool(full_ranking);
DECLARE_int64(eval_batch);
DECLARE_string(resume);
DECLARE_int64(checkpoint_every);
DECLARE_int32(keep_checkpoints);
DECLARE_int64(replica_check_every);
DECLARE_int32(expert_parallel);
DECLARE_int64(max_steps);
DECLARE_bool(final_test);
DECLARE_double(log_every);
DECLARE_int32(prefetch);
DECLARE_string(host_allocator);
DECLARE_int64(length_groups);
DECLARE_int64(softmax_keep_mib);
DECLARE_int64(profile_steps);
DECLARE_int64(profile_after);
DECLARE_string(checkpoint);
DECLARE_string(split);
DECLARE_string(user_ids);
DECLARE_string(history);
DECLARE_int64(top_k);
DECLARE_string(metrics);
DECLARE_bool(curves);

namespace seqrec {

bool is_subcommand(const std::string& cmd);
// Usage for one subcommand (its flags with help and defaults), or the overview.
void print_usage(const std::string& cmd);
// Throws std::runtime_error when a flag that was set does not apply to `cmd`.
void check_flags_apply(const std::string& cmd);
// "" or the first variant option changed from its default under another --model.
std::string model_flags_problem(const std::string& model);
// "--name=value" lines of every flag `cmd` uses, sorted, under a comment: the run's effective
// configuration, itself a flagfile (a run's flags.txt).
std::string effective_flags_text(const std::string& cmd);
// "" or what makes `path` unfit as a --flagfile: it cannot be read, or a line is neither a --flag,
// a # comment nor blank (gflags would read it as a program-name filter and silently skip the
// flags after it).
std::string flagfile_problem(const std::string& path);

}  // namespace seqrec
