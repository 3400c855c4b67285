// base/nccl_settings.h
//
// Note [NCCL reads its settings at creation]: an NCCL communicator reads NCCL_ALGO and
// NCCL_PROTO from the environment when it is created and keeps what it read, so setting them
// later (as deterministic mode does, numerics/deterministic_mode.h) reaches only communicators
// created afterwards. Whoever creates an NCCL communicator records the settings it was created
// with here, just before creating it (collectives' NcclCommunicator does); deterministic mode
// then refuses to call the process deterministic while one created with other settings exists.
//
// Thread-safety: every function may be called from any thread.
//
// Example:
//   RecordNcclCommunicatorSettings();  // then ncclCommInitRankConfig(...)

#ifndef LOCKSTEP_BASE_NCCL_SETTINGS_H_
#define LOCKSTEP_BASE_NCCL_SETTINGS_H_

#include <string>
#include <vector>

namespace lockstep {

// The reduction-order settings an NCCL communicator was created with ("" when unset).
struct NcclSettings {
  std::string algo;   // NCCL_ALGO
  std::string proto;  // NCCL_PROTO
};

// Records the environment's NCCL settings as those of a communicator about to be created.
void RecordNcclCommunicatorSettings();

// Every distinct setting that communicators of this process were created with, in the order
// first seen; empty before the first.
std::vector<NcclSettings> NcclCommunicatorSettings();

}  // namespace lockstep

#endif  // LOCKSTEP_BASE_NCCL_SETTINGS_H_
