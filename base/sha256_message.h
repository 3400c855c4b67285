// base/sha256_message.h
//
// Hashing a protobuf message without building its bytes: the message's deterministic
// serialization is streamed through a Sha256Hasher block by block, framed as Sha256Framed frames
// a part (8-byte little-endian length, then the bytes). So for any message m,
//   h.AppendFramed(tag); AppendMessageFramed(h, m); h.Finish()
// equals Sha256Framed({tag, <m serialized deterministically>}), at the cost of one pass and a
// 64 KiB buffer instead of a copy of the whole message (plans of a million sequences are tens of
// megabytes).
//
// Thread-safety: as the hasher's (one thread).

#ifndef LOCKSTEP_BASE_SHA256_MESSAGE_H_
#define LOCKSTEP_BASE_SHA256_MESSAGE_H_

#include <string>

#include "base/sha256.h"
#include "google/protobuf/message_lite.h"

namespace lockstep {

// The message's deterministic serialization (map entries ordered), as hashed below.
std::string SerializeDeterministically(const google::protobuf::MessageLite& message);

// Appends the framed deterministic serialization of `message` to `hasher`.
void AppendMessageFramed(Sha256Hasher& hasher, const google::protobuf::MessageLite& message);

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_SHA256_MESSAGE_H_
