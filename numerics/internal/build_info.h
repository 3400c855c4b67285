// numerics/internal/build_info.h
//
// Private to numerics/: the git commit lockstep was built from, stamped at build time by Bazel's
// workspace status (tools/workspace_status.sh, STABLE_GIT_COMMIT; "+dirty" when the tree had
// uncommitted changes), or "unknown" when the build was not stamped.

#ifndef LOCKSTEP_NUMERICS_INTERNAL_BUILD_INFO_H_
#define LOCKSTEP_NUMERICS_INTERNAL_BUILD_INFO_H_

#include <string>

namespace lockstep {
namespace numerics {
namespace internal {

std::string BuildCommit();

}  // namespace internal
}  // namespace numerics
}  // namespace lockstep

#endif  // LOCKSTEP_NUMERICS_INTERNAL_BUILD_INFO_H_
