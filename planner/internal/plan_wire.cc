#include "planner/internal/plan_wire.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "google/protobuf/unknown_field_set.h"

namespace lockstep {
namespace planner {
namespace internal {
namespace {

// Wire types (protobuf encoding).
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2;

constexpr uint32_t Tag(uint32_t field, uint32_t wire_type) { return (field << 3) | wire_type; }

// Bytes of x as a varint (one per started group of 7 bits, at least one), by the count of its
// leading zero bits: a table lookup, not a division, since the size pass visits every value.
constexpr std::array<uint8_t, 64> VarintBytesByLeadingZeros() {
  std::array<uint8_t, 64> bytes{};
  for (int zeros = 0; zeros < 64; ++zeros)
    bytes[zeros] = static_cast<uint8_t>((64 - zeros + 6) / 7);
  return bytes;
}
constexpr std::array<uint8_t, 64> kVarintBytes = VarintBytesByLeadingZeros();

inline uint64_t VarintSize(uint64_t x) { return kVarintBytes[__builtin_clzll(x | 1)]; }
// int32 and enum values are sign-extended to 64 bits first (a negative one takes ten bytes).
inline uint64_t VarintSize32(int32_t x) {
  return VarintSize(static_cast<uint64_t>(static_cast<int64_t>(x)));
}

template <typename T>
uint64_t PackedVarintPayload(const google::protobuf::RepeatedField<T>& values) {
  uint64_t size = 0;
  for (const T x : values) {
    if constexpr (sizeof(T) == 4) {
      size += VarintSize32(x);
    } else {
      size += VarintSize(static_cast<uint64_t>(x));
    }
  }
  return size;
}

// A length-delimited field of `payload` bytes with a one-byte tag (every field number here is
// below 16).
inline uint64_t DelimitedSize(uint64_t payload) { return 1 + VarintSize(payload) + payload; }

inline uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

uint64_t LimitsSize(const PlanLimits& limits) {
  uint64_t size = 0;
  if (limits.max_tokens_per_microbatch() != 0) {
    size += 1 + VarintSize(static_cast<uint64_t>(limits.max_tokens_per_microbatch()));
  }
  if (limits.cp_size() != 0) size += 1 + VarintSize32(limits.cp_size());
  if (limits.packing() != 0) size += 1 + VarintSize32(limits.packing());
  if (limits.loss_normalization() != 0) size += 1 + VarintSize32(limits.loss_normalization());
  return size;
}

// Whether `message` holds fields plan.proto does not know (kept from parsed bytes).
bool HasUnknownFields(const google::protobuf::Message& message) {
  return !message.GetReflection()->GetUnknownFields(message).empty();
}

MicrobatchWireSizes MicrobatchSize(const Microbatch& mb) {
  MicrobatchWireSizes sizes;
  uint64_t* packed = sizes.packed;
  packed[0] = PackedVarintPayload(mb.batch_index());
  packed[1] = PackedVarintPayload(mb.sequence_id());
  packed[2] = PackedVarintPayload(mb.token_begin());
  packed[3] = PackedVarintPayload(mb.cu_seqlens());
  packed[4] = 8 * static_cast<uint64_t>(mb.loss_scale_size());
  packed[5] = PackedVarintPayload(mb.shard_cp_rank());
  packed[6] = PackedVarintPayload(mb.shard_num_tokens());
  packed[7] = PackedVarintPayload(mb.shard_num_pieces());
  uint64_t total = 0;
  if (mb.num_tokens() != 0) total += 1 + VarintSize(static_cast<uint64_t>(mb.num_tokens()));
  for (const uint64_t payload : sizes.packed) {
    if (payload > 0) total += DelimitedSize(payload);  // an empty array is omitted
  }
  sizes.total = total;
  return sizes;
}

// Encodes into a fixed buffer, handing it to the sink whenever the next value might not fit.
class Writer {
 public:
  explicit Writer(const WireSink& sink) : sink_(sink), p_(buffer_) {}
  ~Writer() { Flush(); }

  void Varint(uint64_t x) {
    Room(10);
    while (x >= 0x80) {
      *p_++ = static_cast<char>(x | 0x80);
      x >>= 7;
    }
    *p_++ = static_cast<char>(x);
  }
  void Varint32(int32_t x) { Varint(static_cast<uint64_t>(static_cast<int64_t>(x))); }
  void Fixed64(uint64_t x) {
    Room(8);
    for (int i = 0; i < 8; ++i) *p_++ = static_cast<char>(x >> (8 * i));
  }
  void Bytes(absl::string_view bytes) {
    if (bytes.size() > sizeof(buffer_) / 2) {
      Flush();
      sink_(bytes);
      return;
    }
    Room(bytes.size());
    std::memcpy(p_, bytes.data(), bytes.size());
    p_ += bytes.size();
  }

  // A packed array: tag, payload size, values. The values go in runs that surely fit the buffer,
  // so the loop that encodes them checks no room.
  template <typename T>
  void PackedVarints(uint32_t field, const google::protobuf::RepeatedField<T>& values,
                     uint64_t payload) {
    if (payload == 0) return;
    Varint(Tag(field, kLengthDelimited));
    Varint(payload);
    constexpr int kRun = sizeof(buffer_) / 2 / 10;
    const T* x = values.data();
    for (int done = 0, n = values.size(); done < n;) {
      const int run = std::min(kRun, n - done);
      Room(10 * static_cast<size_t>(run));
      char* p = p_;
      for (int i = 0; i < run; ++i) {
        uint64_t v = static_cast<uint64_t>(static_cast<int64_t>(x[done + i]));  // sign-extended
        while (v >= 0x80) {
          *p++ = static_cast<char>(v | 0x80);
          v >>= 7;
        }
        *p++ = static_cast<char>(v);
      }
      p_ = p;
      done += run;
    }
  }

 private:
  void Room(size_t n) {
    if (static_cast<size_t>(buffer_ + sizeof(buffer_) - p_) < n) Flush();
  }
  void Flush() {
    if (p_ != buffer_) sink_(absl::string_view(buffer_, static_cast<size_t>(p_ - buffer_)));
    p_ = buffer_;
  }

  const WireSink& sink_;
  char buffer_[1 << 16];
  char* p_;
};

void WriteMicrobatch(const Microbatch& mb, const MicrobatchWireSizes& sizes, Writer& out) {
  if (mb.num_tokens() != 0) {
    out.Varint(Tag(1, kVarint));
    out.Varint(static_cast<uint64_t>(mb.num_tokens()));
  }
  out.PackedVarints(2, mb.batch_index(), sizes.packed[0]);
  out.PackedVarints(3, mb.sequence_id(), sizes.packed[1]);
  out.PackedVarints(4, mb.token_begin(), sizes.packed[2]);
  out.PackedVarints(5, mb.cu_seqlens(), sizes.packed[3]);
  if (sizes.packed[4] > 0) {
    out.Varint(Tag(6, kLengthDelimited));
    out.Varint(sizes.packed[4]);
    for (const double x : mb.loss_scale()) out.Fixed64(DoubleBits(x));
  }
  out.PackedVarints(8, mb.shard_cp_rank(), sizes.packed[5]);
  out.PackedVarints(9, mb.shard_num_tokens(), sizes.packed[6]);
  out.PackedVarints(10, mb.shard_num_pieces(), sizes.packed[7]);
}

}  // namespace

std::optional<PlanWireSizes> PlanWireSize(const Plan& plan) {
  if (HasUnknownFields(plan)) return std::nullopt;
  PlanWireSizes sizes;
  uint64_t total = 0;
  if (plan.has_limits()) {
    if (HasUnknownFields(plan.limits())) return std::nullopt;
    sizes.limits = LimitsSize(plan.limits());
    total += DelimitedSize(sizes.limits);
  }
  if (plan.packing_applied() != 0) total += 1 + VarintSize32(plan.packing_applied());
  if (plan.num_sequences() != 0) total += 1 + VarintSize32(plan.num_sequences());
  if (plan.num_tokens() != 0) total += 1 + VarintSize(static_cast<uint64_t>(plan.num_tokens()));
  if (DoubleBits(plan.loss_weight_total()) != 0) total += 1 + 8;
  sizes.microbatch.reserve(static_cast<size_t>(plan.microbatches_size()));
  for (const Microbatch& mb : plan.microbatches()) {
    if (HasUnknownFields(mb)) return std::nullopt;
    sizes.microbatch.push_back(MicrobatchSize(mb));
    total += DelimitedSize(sizes.microbatch.back().total);  // present even when empty
  }
  if (plan.splits() != 0) total += 1 + VarintSize32(plan.splits());
  if (plan.cp_chunk_rule() != 0) total += 1 + VarintSize32(plan.cp_chunk_rule());
  if (!plan.loss_weights_digest().empty())
    total += DelimitedSize(plan.loss_weights_digest().size());
  sizes.total = total;
  return sizes;
}

void WritePlanWire(const Plan& plan, const PlanWireSizes& sizes, const WireSink& sink) {
  Writer out(sink);
  if (plan.has_limits()) {
    const PlanLimits& limits = plan.limits();
    out.Varint(Tag(1, kLengthDelimited));
    out.Varint(sizes.limits);
    if (limits.max_tokens_per_microbatch() != 0) {
      out.Varint(Tag(1, kVarint));
      out.Varint(static_cast<uint64_t>(limits.max_tokens_per_microbatch()));
    }
    if (limits.cp_size() != 0) {
      out.Varint(Tag(2, kVarint));
      out.Varint32(limits.cp_size());
    }
    if (limits.packing() != 0) {
      out.Varint(Tag(3, kVarint));
      out.Varint32(limits.packing());
    }
    if (limits.loss_normalization() != 0) {
      out.Varint(Tag(4, kVarint));
      out.Varint32(limits.loss_normalization());
    }
  }
  if (plan.packing_applied() != 0) {
    out.Varint(Tag(2, kVarint));
    out.Varint32(plan.packing_applied());
  }
  if (plan.num_sequences() != 0) {
    out.Varint(Tag(3, kVarint));
    out.Varint32(plan.num_sequences());
  }
  if (plan.num_tokens() != 0) {
    out.Varint(Tag(4, kVarint));
    out.Varint(static_cast<uint64_t>(plan.num_tokens()));
  }
  if (const uint64_t bits = DoubleBits(plan.loss_weight_total()); bits != 0) {
    out.Varint(Tag(5, kFixed64));
    out.Fixed64(bits);
  }
  for (int m = 0; m < plan.microbatches_size(); ++m) {
    out.Varint(Tag(6, kLengthDelimited));
    out.Varint(sizes.microbatch[m].total);
    WriteMicrobatch(plan.microbatches(m), sizes.microbatch[m], out);
  }
  if (plan.splits() != 0) {
    out.Varint(Tag(7, kVarint));
    out.Varint32(plan.splits());
  }
  if (plan.cp_chunk_rule() != 0) {
    out.Varint(Tag(8, kVarint));
    out.Varint32(plan.cp_chunk_rule());
  }
  if (!plan.loss_weights_digest().empty()) {
    out.Varint(Tag(9, kLengthDelimited));
    out.Varint(plan.loss_weights_digest().size());
    out.Bytes(plan.loss_weights_digest());
  }
}

}  // namespace internal
}  // namespace planner
}  // namespace lockstep
