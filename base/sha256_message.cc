#include "base/sha256_message.h"

#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace lockstep {
namespace {

// Feeds what a CodedOutputStream writes into a Sha256Hasher, one buffer at a time.
class HashingOutputStream : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit HashingOutputStream(Sha256Hasher& hasher) : hasher_(hasher), buffer_(1 << 16) {}

  bool Next(void** data, int* size) override {
    Flush();
    pending_ = static_cast<int>(buffer_.size());
    *data = buffer_.data();
    *size = pending_;
    return true;
  }
  void BackUp(int count) override { pending_ -= count; }
  int64_t ByteCount() const override { return hashed_ + pending_; }

  // Hashes what the last buffer handed out holds.
  void Flush() {
    if (pending_ > 0) hasher_.Append(absl::string_view(buffer_.data(), pending_));
    hashed_ += pending_;
    pending_ = 0;
  }

 private:
  Sha256Hasher& hasher_;
  std::vector<char> buffer_;
  int pending_ = 0;
  int64_t hashed_ = 0;
};

}  // namespace

std::string SerializeDeterministically(const google::protobuf::MessageLite& message) {
  std::string bytes(message.ByteSizeLong(), '\0');
  {
    google::protobuf::io::ArrayOutputStream stream(bytes.data(), static_cast<int>(bytes.size()));
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    message.SerializeWithCachedSizes(&out);
  }
  return bytes;
}

void AppendMessageFramed(Sha256Hasher& hasher, const google::protobuf::MessageLite& message) {
  hasher.AppendLength(message.ByteSizeLong());
  HashingOutputStream stream(hasher);
  {
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    message.SerializeWithCachedSizes(&out);
  }
  stream.Flush();
}

}  // namespace lockstep
