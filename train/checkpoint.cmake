seqrec_add_library(seqrec_checkpoint SOURCES checkpoint.cpp DEPS ZLIB::ZLIB seqrec_dist)
