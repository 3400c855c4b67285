// glog behind base/logging.h. No c10 header may be included here: c10 built without glog
// defines LOG/CHECK macros of its own that would collide with glog's.

#include "base/logging.h"

#include <cstdlib>

#include "glog/logging.h"

namespace lockstep {

void InitLogging(const char* argv0) {
  if (google::IsGoogleLoggingInitialized()) return;
  const bool chosen = std::getenv("GLOG_logtostderr") != nullptr ||
                      std::getenv("GLOG_alsologtostderr") != nullptr ||
                      std::getenv("GLOG_log_dir") != nullptr;
  if (!chosen) FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0 != nullptr ? argv0 : "lockstep");
}

namespace logging_internal {

Message::~Message() {
  const std::string text = stream_.str();
  switch (severity_) {
    case Severity::INFO:
      google::LogMessage(file_, line_, google::GLOG_INFO).stream() << text;
      break;
    case Severity::WARNING:
      google::LogMessage(file_, line_, google::GLOG_WARNING).stream() << text;
      break;
    case Severity::ERROR:
      google::LogMessage(file_, line_, google::GLOG_ERROR).stream() << text;
      break;
    case Severity::FATAL:
      google::LogMessageFatal(file_, line_).stream() << text;  // aborts
      break;
  }
}

bool VlogIsOn(int level) { return FLAGS_v >= level; }

}  // namespace logging_internal
}  // namespace lockstep
