#pragma once
// A named region in op profiles (`seqrec train --profile_steps N`): while a profiler runs, the
// time between this line and the end of the enclosing scope is reported under `name`, with the
// Torch ops it calls nested inside; otherwise it costs one check of a thread-local flag.
#include <ATen/record_function.h>

#define SEQREC_PROFILE_SCOPE(name) RECORD_USER_SCOPE(name)
