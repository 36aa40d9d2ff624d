# Sourced by the bench scripts: the OpenBLAS kernel family the seqrec launcher picks from the
# CPU's features (launcher/main.cpp): on these VMs OpenBLAS's own detection falls back to
# SSE3 "Prescott" kernels, several times slower.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  _flags=$(grep -m1 '^flags' /proc/cpuinfo)
  if [[ $_flags == *avx512f* && $_flags == *avx512bw* && $_flags == *avx512dq* && $_flags == *avx512vl* ]]; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif [[ $_flags == *avx2* && $_flags == *fma* ]]; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
