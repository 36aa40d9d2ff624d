#!/bin/sh
# The compiler launcher's last step (cmake/CcacheLauncher.cmake): runs its arguments (ccache and
# the compile line) after removing the output of a compile that writes a GCC precompiled header
# (-o *.gch). Left in place, the old .gch is hashed into the key of the compile that replaces it
# (ccache issue #1196: GCC's PCH compile -includes the header it precompiles, and ccache hashes
# an existing .gch of it), so a PCH rebuilt over an old one never hits, nor does any file that
# includes it; GCC would also read the old one while writing the new one.
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then
    case "$arg" in
      *.gch) rm -f -- "$arg" ;;
    esac
  fi
  prev=$arg
done
exec "$@"
