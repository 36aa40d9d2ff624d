#pragma once
// The one place that brings in glog-style logging. Debian's LibTorch is built with glog
// (C10_USE_GLOG) and c10's header then includes glog itself; PyTorch wheels are built
// without glog and c10 provides its own LOG/CHECK. Including glog directly next to Torch
// headers breaks the wheel build, so every file logs through this header.
#include <c10/util/Logging.h>
