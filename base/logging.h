// base/logging.h
//
// lockstep's one logging entry point, over glog in every build:
//   LOCKSTEP_LOG(INFO|WARNING|ERROR|FATAL) << ...;   FATAL aborts after logging
//   LOCKSTEP_VLOG(level) << ...;                       progress (1) and diagnostics (2+)
//   LOCKSTEP_CHECK(condition) << ...;                  a broken internal invariant: aborts
//   LOCKSTEP_DCHECK(condition) << ...;                 as CHECK, in debug builds only
//
// Why our own prefixed macros: LibTorch defines LOG/CHECK/VLOG itself when it is built without
// glog (the pip and CUDA builds) and forwards to glog when built with it (Debian's), so code that
// used either set would read differently against the two. These macros never collide with
// either: this header includes neither glog nor c10, and base/logging.cc, which forwards the
// text to glog, includes no c10 header.
//
// Verbosity and destination follow glog's flags, set from the environment: GLOG_v=N enables
// LOCKSTEP_VLOG(level <= N); GLOG_logtostderr=1 (the default of lockstep's tools, see
// InitLogging) or GLOG_log_dir=DIR; GLOG_minloglevel=N hides severities below N.
//
// Conditions a caller can cause are statuses, never CHECKs (see base/status_macros.h).
//
// Thread-safety: every macro may be used from any thread.
//
// Example:
//   LOCKSTEP_VLOG(1) << "rank " << rank << ": planned " << n << " microbatches";
//   LOCKSTEP_CHECK(offset <= size) << "offset " << offset << " past " << size;

#ifndef LOCKSTEP_BASE_LOGGING_H_
#define LOCKSTEP_BASE_LOGGING_H_

#include <sstream>

namespace lockstep {

// Prepares glog for a command-line tool: records the program name and, unless the environment
// chooses a destination (GLOG_logtostderr, GLOG_alsologtostderr or GLOG_log_dir), logs to
// stderr instead of files under /tmp. Safe to call more than once.
void InitLogging(const char* argv0);

// The glog settings tools document in their --help.
inline constexpr char kLoggingHelp[] =
    "Logging (glog, from the environment): GLOG_v=N shows progress (1) and diagnostics (2+); "
    "GLOG_logtostderr=0 with GLOG_log_dir=DIR logs to files instead of stderr; "
    "GLOG_minloglevel=N hides severities below N (0 INFO .. 3 FATAL).";

namespace logging_internal {

enum class Severity { INFO, WARNING, ERROR, FATAL };

// Collects one message and hands it to glog when destroyed (FATAL: then aborts).
class Message {
 public:
  Message(const char* file, int line, Severity severity)
      : file_(file), line_(line), severity_(severity) {}
  ~Message();
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  Severity severity_;
  std::ostringstream stream_;
};

// Whether LOCKSTEP_VLOG(level) messages are shown (glog's verbosity, GLOG_v).
bool VlogIsOn(int level);

// Turns `stream << ...` into void for the conditional forms below.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace lockstep

// A stream for one log message of `severity` (INFO, WARNING, ERROR or FATAL): what is streamed
// into it goes to glog, with this file and line, when the statement ends; FATAL then aborts.
#define LOCKSTEP_LOG(severity)                                                            \
  ::lockstep::logging_internal::Message(__FILE__, __LINE__,                               \
                                        ::lockstep::logging_internal::Severity::severity) \
      .stream()

// As LOCKSTEP_LOG(INFO), shown only when glog's verbosity (GLOG_v) is at least `level`; the
// streamed operands are not evaluated otherwise.
#define LOCKSTEP_VLOG(level)                     \
  !::lockstep::logging_internal::VlogIsOn(level) \
      ? (void)0                                  \
      : ::lockstep::logging_internal::Voidify() & LOCKSTEP_LOG(INFO)

// Aborts through LOCKSTEP_LOG(FATAL), with "Check failed: <condition>" and whatever is streamed
// after it, unless `condition` holds; for broken internal invariants only, never for what a
// caller can cause (those are statuses). The streamed operands are evaluated only on failure.
#define LOCKSTEP_CHECK(condition)                                             \
  (condition) ? (void)0                                                       \
              : ::lockstep::logging_internal::Voidify() & LOCKSTEP_LOG(FATAL) \
                                                              << "Check failed: " #condition " "

// As LOCKSTEP_CHECK in debug builds; in optimized builds (NDEBUG) it checks nothing and neither
// `condition` nor the streamed operands are evaluated (they must still compile).
#ifdef NDEBUG
#define LOCKSTEP_DCHECK(condition) \
  true ? (void)0 : ::lockstep::logging_internal::Voidify() & LOCKSTEP_LOG(FATAL)
#else
#define LOCKSTEP_DCHECK(condition) LOCKSTEP_CHECK(condition)
#endif

#endif  // LOCKSTEP_BASE_LOGGING_H_
