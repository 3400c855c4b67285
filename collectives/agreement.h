// collectives/agreement.h
//
// A collective agreement check: before an operation whose arguments could differ between ranks
// (registering a custom object, running a possibly empty wave, using a plan), every member of a
// group confirms it is about to run the same operation with the same metadata. Each member
// contributes a SHA-256 digest of (operation, metadata); if the digests differ, every member
// gets the same kFailedPrecondition error naming which global ranks hold which digest, instead
// of the group hanging or silently computing with mismatched arguments later.
//
// Thread-safety: as the communicator's.
//
// Example:
//   LOCKSTEP_RETURN_IF_ERROR(collectives::CheckAgreement(
//       tp_cp_group, "register_object", absl::StrCat(name, "/", config.SerializeAsString())));

#ifndef LOCKSTEP_COLLECTIVES_AGREEMENT_H_
#define LOCKSTEP_COLLECTIVES_AGREEMENT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/sha256.h"
#include "collectives/communicator.h"

namespace lockstep {
namespace collectives {

// SHA-256 of `operation` and `metadata`, framed so that ("ab", "c") and ("a", "bc") differ.
Sha256Digest AgreementDigest(absl::string_view operation, absl::string_view metadata);

// OK when every member of `comm` called CheckAgreement with the same operation and metadata.
// Otherwise kFailedPrecondition on every member, naming the groups of global ranks that agree
// with each other, each with its digest prefix and operation name. Errors of the underlying
// all-gather (a dead or late peer) are returned as they are, with context.
absl::Status CheckAgreement(Communicator& comm, absl::string_view operation,
                            absl::string_view metadata);

// Words a disagreement from every member's metadata, indexed by group rank. Every member calls it
// with the same list, so every member's error reads alike.
using AgreementExplainer =
    std::function<std::string(const std::vector<std::string>& metadata_by_member)>;

// CheckAgreement that can say what differs: on disagreement (only then: agreement costs the one
// all-gather) every member broadcasts its metadata in turn and the kFailedPrecondition error
// carries `explain`'s words after the ranks and digests.
absl::Status CheckAgreement(Communicator& comm, absl::string_view operation,
                            absl::string_view metadata, const AgreementExplainer& explain);

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_AGREEMENT_H_
