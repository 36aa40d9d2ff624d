#include "io/text_input.h"

#include <lzma.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace seqrec::io {
namespace {

constexpr size_t kInputChunk = 1 << 20;
constexpr size_t kLineChunk = 1 << 20;
// A "line" this long means the file is not a text log (binary data, wrong format).
constexpr size_t kMaxLine = 64u << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

}  // namespace

// Reads raw file bytes and turns them into decompressed bytes.
class TextInput::Decoder {
 public:
  Decoder(std::FILE* f, std::string path) : f_(f), path_(std::move(path)), in_(kInputChunk) {}
  virtual ~Decoder() { std::fclose(f_); }
  virtual const char* name() const = 0;
  // Fills up to `cap` decompressed bytes; 0 only at the end of the input.
  virtual size_t read(char* dst, size_t cap) = 0;
  int64_t consumed() const { return consumed_; }

 protected:
  // Refills the compressed buffer; returns the bytes available (0 at the end of the file).
  size_t fill() {
    const size_t n = std::fread(in_.data(), 1, in_.size(), f_);
    if (n == 0 && std::ferror(f_)) fail(path_, std::string("read error: ") + std::strerror(errno));
    consumed_ += static_cast<int64_t>(n);
    return n;
  }

  std::FILE* f_;
  std::string path_;
  std::vector<unsigned char> in_;
  int64_t consumed_ = 0;
};

namespace {

class PlainDecoder final : public TextInput::Decoder {
 public:
  using Decoder::Decoder;
  const char* name() const override { return "none"; }
  size_t read(char* dst, size_t cap) override {
    const size_t n = std::fread(dst, 1, cap, f_);
    if (n == 0 && std::ferror(f_)) fail(path_, std::string("read error: ") + std::strerror(errno));
    consumed_ += static_cast<int64_t>(n);
    return n;
  }
};

class GzipDecoder final : public TextInput::Decoder {
 public:
  GzipDecoder(std::FILE* f, std::string path) : Decoder(f, std::move(path)) {
    std::memset(&z_, 0, sizeof(z_));
    // 15 + 32: any window size, gzip or zlib header detected automatically.
    if (inflateInit2(&z_, 15 + 32) != Z_OK) fail(path_, "cannot initialise zlib");
  }
  ~GzipDecoder() override { inflateEnd(&z_); }
  const char* name() const override { return "gzip"; }

  size_t read(char* dst, size_t cap) override {
    z_.next_out = reinterpret_cast<Bytef*>(dst);
    z_.avail_out = static_cast<uInt>(cap);
    while (z_.avail_out == cap && !done_) {
      if (z_.avail_in == 0) {
        const size_t n = fill();
        if (n == 0) {
          if (!in_member_) {
            done_ = true;
            break;
          }
          fail(path_, "unexpected end of gzip data (truncated file?)");
        }
        z_.next_in = in_.data();
        z_.avail_in = static_cast<uInt>(n);
      }
      if (!in_member_) {
        // Between members: gzip(1) ignores zero padding after the last one (tape-style
        // blocking), so skip zeros; anything else must start a new member.
        while (z_.avail_in > 0 && *z_.next_in == 0) {
          ++z_.next_in;
          --z_.avail_in;
        }
        if (z_.avail_in == 0) continue;
        if (*z_.next_in != 0x1f) fail(path_, "trailing garbage after the gzip data");
      }
      in_member_ = true;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        // gzip files may hold several members back to back (cat a.gz b.gz); keep going.
        in_member_ = false;
        inflateReset(&z_);
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(path_, std::string("corrupt gzip data: ") + (z_.msg ? z_.msg : zError(rc)));
      }
    }
    return cap - z_.avail_out;
  }

 private:
  z_stream z_;
  bool in_member_ = false;
  bool done_ = false;
};

class XzDecoder final : public TextInput::Decoder {
 public:
  XzDecoder(std::FILE* f, std::string path) : Decoder(f, std::move(path)) {
    if (lzma_stream_decoder(&s_, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK) fail(path_, "cannot initialise liblzma");
  }
  ~XzDecoder() override { lzma_end(&s_); }
  const char* name() const override { return "xz"; }

  size_t read(char* dst, size_t cap) override {
    s_.next_out = reinterpret_cast<uint8_t*>(dst);
    s_.avail_out = cap;
    while (s_.avail_out == cap && !done_) {
      if (s_.avail_in == 0 && !at_eof_) {
        const size_t n = fill();
        at_eof_ = n == 0;
        s_.next_in = in_.data();
        s_.avail_in = n;
      }
      const lzma_ret rc = lzma_code(&s_, at_eof_ ? LZMA_FINISH : LZMA_RUN);
      if (rc == LZMA_STREAM_END) {
        done_ = true;
      } else if (rc != LZMA_OK) {
        fail(path_, std::string("corrupt xz data: ") + describe(rc));
      }
    }
    return cap - s_.avail_out;
  }

 private:
  static const char* describe(lzma_ret rc) {
    switch (rc) {
      case LZMA_MEM_ERROR: return "out of memory";
      case LZMA_FORMAT_ERROR: return "not in the xz format";
      case LZMA_OPTIONS_ERROR: return "unsupported options";
      case LZMA_DATA_ERROR: return "data is corrupt";
      case LZMA_BUF_ERROR: return "unexpected end of input (truncated file?)";
      default: return "decoder error";
    }
  }

  lzma_stream s_ = LZMA_STREAM_INIT;
  bool at_eof_ = false;
  bool done_ = false;
};

}  // namespace

TextInput::TextInput(const std::string& path) : path_(path), buf_(kLineChunk) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (std::fseek(f, 0, SEEK_END) == 0) file_size_ = std::ftell(f);
  unsigned char magic[6] = {0};
  std::rewind(f);
  const size_t got = std::fread(magic, 1, sizeof(magic), f);
  std::rewind(f);
  if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    decoder_ = std::make_unique<GzipDecoder>(f, path);
  } else if (got == 6 && std::memcmp(magic, "\xfd" "7zXZ\0", 6) == 0) {
    decoder_ = std::make_unique<XzDecoder>(f, path);
  } else {
    decoder_ = std::make_unique<PlainDecoder>(f, path);
  }
}

TextInput::~TextInput() = default;

const char* TextInput::compression() const { return decoder_->name(); }

int64_t TextInput::compressed_position() const { return decoder_->consumed(); }

std::string TextInput::sha256_hex() { return sha_.hex_digest(); }

bool TextInput::refill() {
  if (eof_) return false;
  // Keep the unfinished line, grow when it fills the whole buffer.
  if (begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buf_.size()) {
    if (buf_.size() >= kMaxLine)
      fail(path_, "line " + std::to_string(line_number_ + 1) + " is longer than " +
                      std::to_string(kMaxLine >> 20) + " MiB: not a text file of interactions?");
    buf_.resize(buf_.size() * 2);
  }
  const size_t n = decoder_->read(buf_.data() + end_, buf_.size() - end_);
  if (n == 0) {
    eof_ = true;
    return false;
  }
  sha_.update(buf_.data() + end_, n);
  end_ += n;
  return true;
}

bool TextInput::next_line(std::string_view& line) {
  size_t scanned = begin_;
  for (;;) {
    const void* nl = std::memchr(buf_.data() + scanned, '\n', end_ - scanned);
    if (nl) {
      const size_t pos = static_cast<const char*>(nl) - buf_.data();
      size_t len = pos - begin_;
      if (len > 0 && buf_[begin_ + len - 1] == '\r') --len;
      line = std::string_view(buf_.data() + begin_, len);
      begin_ = pos + 1;
      ++line_number_;
      return true;
    }
    const size_t unfinished = end_ - begin_;
    if (!refill()) {
      if (begin_ == end_) return false;
      // The last line has no '\n'.
      size_t len = end_ - begin_;
      if (buf_[begin_ + len - 1] == '\r') --len;
      line = std::string_view(buf_.data() + begin_, len);
      begin_ = end_;
      ++line_number_;
      return true;
    }
    scanned = begin_ + unfinished;  // refill moved the unfinished line to the front
  }
}

}  // namespace seqrec::io
