#include "testing/commanded_world.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "base/logging.h"
#include "base/subprocess.h"
#include "base/temp_dir.h"
#include "collectives/gloo_communicator.h"
#include "collectives/rendezvous.h"

namespace lockstep {
namespace collectives {
namespace {

std::unique_ptr<Communicator> Join(const std::string& path, int rank, int size) {
  auto rendezvous = Rendezvous::File(path, rank, size, absl::Seconds(60));
  if (!rendezvous.ok()) {
    LOCKSTEP_LOG(ERROR) << "rank " << rank << ": " << rendezvous.status();
    return nullptr;
  }
  GlooCommunicator::Options options;
  options.hostname = "127.0.0.1";
  auto comm = GlooCommunicator::Create(*rendezvous, options);
  if (!comm.ok()) {
    LOCKSTEP_LOG(ERROR) << "rank " << rank << ": " << comm.status();
    return nullptr;
  }
  return std::move(*comm);
}

// A peer's life: join, then run commands until told to stop. Returns the exit code.
int PeerMain(const CommandedGlooWorlds::Operation& operation, const std::string& path, int rank,
             int size) {
  at::set_num_threads(1);
  std::unique_ptr<Communicator> comm = Join(path, rank, size);
  if (comm == nullptr) return 1;
  for (;;) {
    at::Tensor command = at::zeros({3}, at::kLong);
    if (absl::Status s = comm->Broadcast(command, 0); !s.ok()) {
      LOCKSTEP_LOG(ERROR) << "commanded peer " << rank << " of " << size << ": " << s;
      return 1;
    }
    const int64_t op = command[0].item<int64_t>();
    if (op == 0) return 0;
    at::Tensor payload = at::zeros({command[1].item<int64_t>()}, at::kByte);
    for (int64_t i = 0, n = command[2].item<int64_t>(); i < n; ++i) {
      if (absl::Status s = operation(*comm, op, payload); !s.ok()) {
        LOCKSTEP_LOG(ERROR) << "commanded peer " << rank << " of " << size << ", operation " << op
                            << ": " << s;
        return 1;
      }
    }
  }
}

}  // namespace

void CommandedGlooWorlds::Start(const std::vector<int>& sizes) {
  std::map<int, std::string> paths;
  for (int size : sizes) {
    std::string dir = absl::StrCat(TempDir::Root(), "/lockstep_commanded.XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) continue;
    worlds_[size].dir = dir;
    paths[size] = std::string(dir) + "/store";
    for (int rank = 1; rank < size; ++rank) {
      const std::string path = paths[size];
      absl::StatusOr<Child> peer = Child::Fork(ChildOptions::Reporting(), [&, rank, path](int) {
        return PeerMain(operation_, path, rank, size);
      });
      if (!peer.ok()) {
        LOCKSTEP_LOG(ERROR) << "starting commanded peer " << rank << " of " << size << ": "
                            << peer.status();
        continue;
      }
      worlds_[size].peers.push_back(std::move(*peer));
    }
  }
  at::set_num_threads(1);
  for (const auto& [size, path] : paths) worlds_[size].rank0 = Join(path, 0, size);
}

Communicator* CommandedGlooWorlds::rank0(int size) {
  auto it = worlds_.find(size);
  return it == worlds_.end() ? nullptr : it->second.rank0.get();
}

absl::Status CommandedGlooWorlds::Command(int size, int64_t op, int64_t bytes, int64_t iterations) {
  Communicator* comm = rank0(size);
  if (comm == nullptr) return absl::FailedPreconditionError("the Gloo world did not start");
  at::Tensor command = at::tensor({op, bytes, iterations}, at::kLong);
  return comm->Broadcast(command, 0);
}

void CommandedGlooWorlds::Stop() {
  for (auto& [size, world] : worlds_) {
    if (world.rank0 != nullptr) {
      at::Tensor stop = at::zeros({3}, at::kLong);
      (void)world.rank0->Broadcast(stop, 0);
      world.rank0.reset();
    }
    for (Child& peer : world.peers) peer.Reap();
    world.peers.clear();
    if (!world.dir.empty()) {
      unlink((world.dir + "/store").c_str());
      rmdir(world.dir.c_str());
      world.dir.clear();
    }
  }
}

}  // namespace collectives
}  // namespace lockstep
