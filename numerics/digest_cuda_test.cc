// The CUDA digest: the kernel's chunk hashes equal libxxhash's, and a CUDA tensor has the digest
// of its CPU copy for every size class, dtype and layout (including unaligned views).

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_testutil.h"
#include "gtest/gtest.h"
#include "numerics/digest.h"
#include "numerics/internal/chunk_hash_device.h"
#include "numerics/inventory.h"
#include "numerics/safetensors.h"

namespace lockstep {
namespace numerics {
namespace {

// The operator recorder's path (Note [Deferred digests] in op_recorder.cc): chunk hashes enqueued
// tensor by tensor, collected later, give DigestTensor's digests, also after the tensors changed.
TEST(DigestCudaTest, EnqueuedChunkHashesGiveTheDigest) {
  at::manual_seed(6);
  std::vector<at::Tensor> tensors;
  for (int64_t n : {0L, 1L, 4097L, 65536L * 3 + 5}) tensors.push_back(at::randn({n}, at::kCUDA));
  const at::Tensor bytes = at::randint(0, 255, {100001}, at::kByte).to(at::kCUDA);
  tensors.push_back(bytes.narrow(0, 3, 50000));           // misaligned
  tensors.push_back(at::randn({64, 48}, at::kCUDA).t());  // not contiguous
  std::vector<Digest128> want;
  std::vector<at::Tensor> pending;
  for (const at::Tensor& t : tensors) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 d, DigestTensor(t.cpu()));
    want.push_back(d);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(at::Tensor hashes, internal::EnqueueChunkHashes(t));
    pending.push_back(hashes);
    t.fill_(1);  // after the hashes were enqueued: not seen by them
  }
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(internal::ChunkHashes collected,
                                internal::CollectChunkHashes(pending));
  ASSERT_EQ(collected.of_tensor.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::string dtype,
                                  SafetensorsDtypeName(tensors[i].scalar_type()));
    const Digest128 got =
        TensorRecordDigest(dtype, tensors[i].sizes(),
                           static_cast<uint64_t>(tensors[i].numel()) * tensors[i].element_size(),
                           collected.of_tensor[i]);
    EXPECT_EQ(got, want[i]) << "tensor " << i;
  }
  EXPECT_FALSE(internal::EnqueueChunkHashes(at::ones({3})).ok());  // a CPU tensor
}

TEST(DigestCudaTest, ACudaTensorHasTheDigestOfItsCpuCopy) {
  at::manual_seed(5);
  for (int64_t n : {0L, 1L, 7L, 4096L, 4097L, 65536L * 3 + 5, 10000000L}) {
    const at::Tensor cpu = at::randn({n});
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host, DigestTensor(cpu));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 device, DigestTensor(cpu.to(at::kCUDA)));
    EXPECT_EQ(host, device) << n << " elements";
  }
  const at::Tensor bytes = at::randint(0, 255, {100001}, at::kByte);
  for (int64_t offset : {1, 3, 5}) {  // views at odd offsets (the kernel loads 8-byte words)
    const at::Tensor view = bytes.narrow(0, offset, 50000);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host, DigestTensor(view));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 device, DigestTensor(view.to(at::kCUDA)));
    EXPECT_EQ(host, device) << offset;
  }
  // Views at offsets inside a CUDA buffer: 8-byte but not 16-byte aligned, odd, 16-byte aligned
  // (the kernel loads 8-byte words).
  const at::Tensor on_gpu = bytes.to(at::kCUDA);
  for (int64_t offset : {8, 1, 16, 24}) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host, DigestTensor(bytes.narrow(0, offset, 60000)));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 device, DigestTensor(on_gpu.narrow(0, offset, 60000)));
    EXPECT_EQ(host, device) << "offset " << offset << " in a CUDA buffer";
  }
  for (at::ScalarType t : {at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kBool}) {
    const at::Tensor x = at::randn({333, 77}).to(t);
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host, DigestTensor(x));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 device, DigestTensor(x.to(at::kCUDA)));
    EXPECT_EQ(host, device) << t;
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host_transposed, DigestTensor(x.t()));
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 device_transposed, DigestTensor(x.t().to(at::kCUDA)));
    EXPECT_EQ(host_transposed, device_transposed) << t;
  }
}

// Batched across CUDA and CPU tensors (Note [Batched digests]): each digest is DigestTensor's.
TEST(DigestCudaTest, DigestTensorsEqualsDigestTensorOfEachAcrossDevices) {
  at::manual_seed(12);
  const at::Tensor bytes = at::randint(0, 255, {100001}, at::kByte).to(at::kCUDA);
  std::vector<at::Tensor> tensors = {at::randn({0}, at::kCUDA), bytes.narrow(0, 5, 50000),
                                     at::randn({333, 77}, at::kCUDA).t(), at::randn({17}),
                                     at::randn({10000000}, at::kCUDA).to(at::kBFloat16)};
  // Note [Digest chunks through shared memory]: views 8-byte but not 16-byte aligned, and ends
  // inside a 16-byte piece and inside an 8-byte word, among neighbours in one block of chunks.
  for (const auto& [offset, length] : std::vector<std::pair<int64_t, int64_t>>{
           {8, 60003}, {24, 16390}, {16, 16384 * 2 + 9}, {0, 16384}, {40, 3}, {8, 16384 + 13}}) {
    tensors.push_back(bytes.narrow(0, offset, length));
  }
  for (int i = 0; i < 500; ++i) tensors.push_back(at::randn({i % 9, 100}, at::kCUDA));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<Digest128> batched, DigestTensors(tensors));
  ASSERT_EQ(batched.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host, DigestTensor(tensors[i].cpu()));
    EXPECT_EQ(batched[i], host) << "tensor " << i;
  }
}

// A batch large enough to be hashed in pieces (Note [Hashes in pieces]): tensors that span piece
// boundaries, and small ones and empty ones between them, each get its CPU copy's digest.
TEST(DigestCudaTest, ABatchHashedInPiecesGivesEachTensorsDigest) {
  at::manual_seed(13);
  std::vector<at::Tensor> tensors = {at::randn({3}, at::kCUDA), at::randn({0}, at::kCUDA),
                                     at::randn({50'000'001}, at::kCUDA)};  // 200 MB
  for (int i = 0; i < 300; ++i) tensors.push_back(at::randn({i % 7, 33}, at::kCUDA));
  tensors.push_back(at::randn({4000, 6001}, at::kCUDA).to(at::kBFloat16));  // 48 MB
  tensors.push_back(at::randn({3000, 5000}, at::kCUDA).t());                // 60 MB, a copy
  tensors.push_back(at::randn({5}, at::kCUDA));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(std::vector<Digest128> batched, DigestTensors(tensors));
  ASSERT_EQ(batched.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOCKSTEP_ASSERT_OK_AND_ASSIGN(Digest128 host, DigestTensor(tensors[i].cpu()));
    EXPECT_EQ(batched[i], host) << "tensor " << i;
  }
}

TEST(DigestCudaTest, InventoriesAgreeAcrossDevices) {
  const NamedTensors cpu = {{"w", at::randn({1024, 1024})}, {"b", at::randn({1024})}};
  NamedTensors gpu;
  for (const auto& [name, t] : cpu) gpu.emplace_back(name, t.to(at::kCUDA));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory a, Inventory::Of(cpu));
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory b, Inventory::Of(gpu));
  EXPECT_EQ(a.state_digest(), b.state_digest());
  EXPECT_EQ(b.entries()[0].device, "cuda:0");
  // One bit flipped on the device changes the digest.
  gpu[0].second.view(at::kInt).index_put_({7, 7}, gpu[0].second.view(at::kInt)[7][7] ^ 1);
  LOCKSTEP_ASSERT_OK_AND_ASSIGN(Inventory c, Inventory::Of(gpu));
  EXPECT_NE(a.state_digest(), c.state_digest());
}

}  // namespace
}  // namespace numerics
}  // namespace lockstep
