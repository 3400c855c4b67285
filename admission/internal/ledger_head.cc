#include "admission/internal/ledger_head.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/sha256.h"

namespace lockstep {
namespace admission {
namespace internal {
namespace {

constexpr absl::string_view kMagic = "lockstep ledger head v1";
constexpr absl::string_view kGenesisTag = "lockstep/admission/ledger-genesis/v1";
constexpr absl::string_view kCheckTag = "lockstep/admission/ledger-head/v1";

std::atomic<void (*)(const char*)> io_hook{nullptr};

void Hook(const char* step) {
  if (void (*hook)(const char*) = io_hook.load()) hook(step);
}

// One slot: the record, its check line, padded with spaces to kHeadSlotBytes (the last a newline).
std::string Slot(const LedgerHead& head, uint64_t generation) {
  const std::string body = absl::StrCat(
      kMagic, "\ngeneration ", generation, "\nledger_id ", head.ledger_id, "\ndp_rank ",
      head.dp_rank, "\nseq ", head.seq, "\nchain ", absl::BytesToHexString(head.chain), "\n");
  std::string slot = absl::StrCat(body, "check ", DigestHex(Sha256Framed({kCheckTag, body})), "\n");
  slot.resize(kHeadSlotBytes - 1, ' ');
  slot.push_back('\n');
  return slot;
}

bool IsHex(absl::string_view text, size_t digits) {
  if (text.size() != digits) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The head in one slot and its generation, or why the slot is not intact.
absl::StatusOr<std::pair<LedgerHead, uint64_t>> ParseSlot(absl::string_view slot) {
  const size_t check_at = slot.find("check ");
  if (check_at == absl::string_view::npos) return absl::DataLossError("no check line");
  const absl::string_view body = slot.substr(0, check_at);
  const size_t check_end = slot.find('\n', check_at);
  if (check_end == absl::string_view::npos) return absl::DataLossError("an unfinished check line");
  const absl::string_view check = slot.substr(check_at + 6, check_end - check_at - 6);
  if (check != DigestHex(Sha256Framed({kCheckTag, body}))) {
    return absl::DataLossError("its check does not match its contents");
  }
  const std::vector<absl::string_view> lines = absl::StrSplit(body, '\n');
  // The magic, five fields, and the empty part after the last newline.
  if (lines.size() != 7 || lines[0] != kMagic || !lines[6].empty()) {
    return absl::DataLossError("not a head record's lines");
  }
  static constexpr absl::string_view kKeys[] = {"",        "generation", "ledger_id",
                                                "dp_rank", "seq",        "chain"};
  LedgerHead head;
  uint64_t generation = 0;
  for (int i = 1; i <= 5; ++i) {
    const std::vector<absl::string_view> kv = absl::StrSplit(lines[i], absl::MaxSplits(' ', 1));
    if (kv.size() != 2 || kv[0] != kKeys[i]) {
      return absl::DataLossError(absl::StrCat("line ", i + 1, " is not '", kKeys[i], " <value>'"));
    }
    bool ok = true;
    switch (i) {
      case 1:
        ok = absl::SimpleAtoi(kv[1], &generation);
        break;
      case 2:
        ok = IsHex(kv[1], 32);
        head.ledger_id = std::string(kv[1]);
        break;
      case 3:
        ok = absl::SimpleAtoi(kv[1], &head.dp_rank) && head.dp_rank >= 0;
        break;
      case 4:
        ok = absl::SimpleAtoi(kv[1], &head.seq) && head.seq >= 0;
        break;
      case 5:
        ok = IsHex(kv[1], 64);
        if (ok) head.chain = absl::HexStringToBytes(kv[1]);
        break;
    }
    if (!ok) return absl::DataLossError(absl::StrCat(kKeys[i], " '", kv[1], "' is malformed"));
  }
  return std::make_pair(std::move(head), generation);
}

// The newest intact slot of `<ledger>-head` and its generation.
absl::StatusOr<std::pair<LedgerHead, uint64_t>> ReadNewest(const std::string& ledger) {
  const std::string path = HeadPath(ledger);
  auto damaged = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("ledger head ", path, " is not intact: ", what));
  };
  absl::StatusOr<std::string> bytes = ReadFileToString(path, 2 * kHeadSlotBytes);
  if (!bytes.ok()) {
    // Not a regular file, or larger than a head: not a head.
    if (absl::IsInvalidArgument(bytes.status())) return damaged(bytes.status().message());
    return bytes.status();
  }
  if (bytes->size() != 2 * kHeadSlotBytes) {
    return damaged(absl::StrCat(bytes->size(), " bytes, not ", 2 * kHeadSlotBytes));
  }
  absl::StatusOr<std::pair<LedgerHead, uint64_t>> slots[2];
  for (int i = 0; i < 2; ++i) {
    slots[i] = ParseSlot(absl::string_view(*bytes).substr(i * kHeadSlotBytes, kHeadSlotBytes));
    if (slots[i].ok() && slots[i]->second % 2 != static_cast<uint64_t>(i)) {
      slots[i] = absl::DataLossError(
          absl::StrCat("generation ", slots[i]->second, " is not one of slot ", i, "'s"));
    }
  }
  if (!slots[0].ok() && !slots[1].ok()) {
    return damaged(absl::StrCat("slot 0: ", slots[0].status().message(),
                                "; slot 1: ", slots[1].status().message()));
  }
  if (slots[0].ok() && slots[1].ok() &&
      (slots[0]->first.ledger_id != slots[1]->first.ledger_id ||
       slots[0]->first.dp_rank != slots[1]->first.dp_rank)) {
    return damaged("its slots name two ledgers");
  }
  if (!slots[1].ok() || (slots[0].ok() && slots[0]->second > slots[1]->second)) {
    return *std::move(slots[0]);
  }
  return *std::move(slots[1]);
}

}  // namespace

std::string HeadPath(const std::string& ledger) { return absl::StrCat(ledger, "-head"); }

std::string NewLedgerId() {
  std::random_device random;
  std::string bytes(16, '\0');
  for (char& b : bytes) b = static_cast<char>(random() & 0xff);
  return absl::BytesToHexString(bytes);
}

std::string GenesisChain(const std::string& ledger_id, int dp_rank) {
  const Sha256Digest digest = Sha256Framed({kGenesisTag, ledger_id, absl::StrCat(dp_rank)});
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

absl::StatusOr<LedgerHead> ReadLedgerHead(const std::string& ledger) {
  absl::StatusOr<std::pair<LedgerHead, uint64_t>> newest = ReadNewest(ledger);
  if (!newest.ok()) return newest.status();
  return std::move(newest->first);
}

absl::Status CreateLedgerHead(const std::string& ledger, const LedgerHead& head) {
  return WriteFileAtomically(HeadPath(ledger), absl::StrCat(Slot(head, 0), Slot(head, 1)));
}

absl::StatusOr<std::unique_ptr<LedgerHeadWriter>> LedgerHeadWriter::Open(
    const std::string& ledger) {
  absl::StatusOr<std::pair<LedgerHead, uint64_t>> newest = ReadNewest(ledger);
  if (!newest.ok()) return newest.status();
  const std::string path = HeadPath(ledger);
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("opening ledger head ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<LedgerHeadWriter>(new LedgerHeadWriter(path, fd, newest->second));
}

LedgerHeadWriter::~LedgerHeadWriter() { close(fd_); }

absl::Status LedgerHeadWriter::Write(const LedgerHead& head) {
  const uint64_t generation = generation_ + 1;
  const std::string slot = Slot(head, generation);
  Hook("head write");
  const off_t offset = static_cast<off_t>((generation % 2) * kHeadSlotBytes);
  size_t done = 0;
  while (done < slot.size()) {
    const ssize_t n =
        pwrite(fd_, slot.data() + done, slot.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("writing ledger head ", path_, ": ", std::strerror(n < 0 ? errno : EIO)));
    }
    done += static_cast<size_t>(n);
  }
  Hook("head sync");
  if (fdatasync(fd_) != 0) {
    return absl::InternalError(
        absl::StrCat("syncing ledger head ", path_, ": ", std::strerror(errno)));
  }
  generation_ = generation;
  return absl::OkStatus();
}

void SetLedgerHeadIoHookForTesting(void (*hook)(const char* step)) { io_hook.store(hook); }

}  // namespace internal
}  // namespace admission
}  // namespace lockstep
