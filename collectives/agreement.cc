#include "collectives/agreement.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/torch_boundary.h"

namespace lockstep {
namespace collectives {
namespace {

// Each member contributes its digest and the (truncated) operation name, so that the error can
// say what the disagreeing ranks were about to do.
constexpr int kNameBytes = 64;
constexpr int kRecordBytes = 32 + kNameBytes;

}  // namespace

Sha256Digest AgreementDigest(absl::string_view operation, absl::string_view metadata) {
  return Sha256Framed({operation, metadata});
}

absl::Status CheckAgreement(Communicator& comm, absl::string_view operation,
                            absl::string_view metadata) {
  return CheckAgreement(comm, operation, metadata, nullptr);
}

absl::Status CheckAgreement(Communicator& comm, absl::string_view operation,
                            absl::string_view metadata, const AgreementExplainer& explain) {
  const Sha256Digest digest = AgreementDigest(operation, metadata);
  at::Tensor record;
  LOCKSTEP_RETURN_IF_ERROR(CallTorch("building the agreement record", [&] {
    record = at::zeros({kRecordBytes}, at::kByte);
    uint8_t* data = record.data_ptr<uint8_t>();
    std::memcpy(data, digest.data(), digest.size());
    std::memcpy(data + 32, operation.data(), std::min<size_t>(operation.size(), kNameBytes));
  }));
  absl::StatusOr<std::vector<at::Tensor>> records = comm.AllGather(record);
  if (!records.ok()) {
    return Annotate(records.status(), absl::StrCat("while checking that ", comm.DebugName(),
                                                   " agrees on '", operation, "'"));
  }
  // Group members by what they hold, in group-rank order.
  std::map<std::string, std::vector<int>> holders;  // record bytes -> global ranks
  std::vector<std::string> order;
  for (int m = 0; m < comm.size(); ++m) {
    const at::Tensor& r = (*records)[m];
    std::string bytes(reinterpret_cast<const char*>(r.data_ptr<uint8_t>()), kRecordBytes);
    auto [it, inserted] = holders.try_emplace(bytes);
    if (inserted) order.push_back(bytes);
    it->second.push_back(comm.global_ranks()[m]);
  }
  if (holders.size() == 1) return absl::OkStatus();
  std::vector<std::string> parts;
  for (const std::string& bytes : order) {
    Sha256Digest held;
    std::memcpy(held.data(), bytes.data(), held.size());
    std::string name = bytes.substr(32, kNameBytes);
    name.resize(std::strlen(name.c_str()));
    parts.push_back(absl::StrCat("global rank(s) ", FormatRanks(holders[bytes]), " hold ",
                                 DigestHex(held, 4), " ('", name, "')"));
  }
  std::string message = absl::StrCat("ranks of ", comm.DebugName(), " disagree before '", operation,
                                     "': ", absl::StrJoin(parts, "; "));
  if (explain) {
    // Every member's metadata, each broadcasting its own in turn.
    std::vector<std::string> all(comm.size());
    for (int m = 0; m < comm.size(); ++m) {
      if (m == comm.rank()) all[m] = std::string(metadata);
      LOCKSTEP_RETURN_IF_ERROR_WITH_CONTEXT(
          BroadcastBytes(comm, &all[m], m),
          absl::StrCat("explaining why ", comm.DebugName(), " disagrees on '", operation, "'"));
    }
    absl::StrAppend(&message, ": ", explain(all));
  }
  return absl::FailedPreconditionError(message);
}

}  // namespace collectives
}  // namespace lockstep
