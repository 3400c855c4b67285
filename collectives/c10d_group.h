// collectives/c10d_group.h
//
// C10dGroup: the c10d type a process group's collectives are called on, which moved between
// LibTorch versions. In 1.x a torch.distributed group (ProcessGroupGloo, ProcessGroupNCCL) is a
// c10d::ProcessGroup; from 2.0 a ProcessGroup holds one c10d::Backend per device type, and the
// Gloo and NCCL groups are Backends. lockstep's communicators over c10d groups take a C10dGroup,
// so the same code builds against Debian's LibTorch 1.13 and the H200's 2.11.

#ifndef LOCKSTEP_COLLECTIVES_C10D_GROUP_H_
#define LOCKSTEP_COLLECTIVES_C10D_GROUP_H_

#include "torch/csrc/api/include/torch/version.h"

namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace lockstep {
namespace collectives {

// The c10d type a Gloo or NCCL group's collectives are called on: c10d::Backend from LibTorch
// 2.0, c10d::ProcessGroup before (see the top of this file).
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

}  // namespace collectives
}  // namespace lockstep

#endif  // LOCKSTEP_COLLECTIVES_C10D_GROUP_H_
