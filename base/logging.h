// base/logging.h
//
// lockstep's one logging entry point: LOG(severity), CHECK(cond), DCHECK(cond) and friends.
//
// Why one header: LibTorch built with glog (Debian's) forwards c10's logging to glog, while
// LibTorch built without it (the pip/CUDA builds) defines LOG and CHECK itself. Including glog
// beside the latter redefines those macros. c10/util/Logging.h always yields one consistent set,
// so every lockstep file includes this header and never glog or c10 logging directly.
// Recent c10 (without glog) has CHECK but not the comparison forms; they are defined here on
// top of CHECK so that code reads the same against either LibTorch.

#ifndef LOCKSTEP_BASE_LOGGING_H_
#define LOCKSTEP_BASE_LOGGING_H_

#include "c10/util/Logging.h"

#ifndef CHECK_EQ
#define CHECK_EQ(a, b) CHECK((a) == (b))
#define CHECK_NE(a, b) CHECK((a) != (b))
#define CHECK_LT(a, b) CHECK((a) < (b))
#define CHECK_LE(a, b) CHECK((a) <= (b))
#define CHECK_GT(a, b) CHECK((a) > (b))
#define CHECK_GE(a, b) CHECK((a) >= (b))
#endif

#endif  // LOCKSTEP_BASE_LOGGING_H_
