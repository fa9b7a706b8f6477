// MAC key file and artifact signing: the key is created private, reused, and a client with
// another key refuses the artifact.
#include "cache/mac.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "tests/cpp/support/temp_dir.h"

namespace kiln::cache {
namespace {

TEST(Mac, KeyFileIsCreated0600AndReused) {
  testing::TempDir dir;
  std::string path = dir.Sub("keys/mac.key");
  absl::StatusOr<Mac> first = Mac::LoadOrCreate(path);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(st.st_size, 32);
  absl::StatusOr<Mac> second = Mac::LoadOrCreate(path);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->Sign("data"), second->Sign("data"));
}

TEST(Mac, RefusesKeyFileReadableByOthers) {
  testing::TempDir dir;
  std::string path = dir.Sub("mac.key");
  ASSERT_TRUE(Mac::LoadOrCreate(path).ok());
  ::chmod(path.c_str(), 0644);
  EXPECT_EQ(Mac::LoadOrCreate(path).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Mac, RefusesKeyOfWrongSize) {
  testing::TempDir dir;
  std::string path = dir.Sub("mac.key");
  std::ofstream(path) << "short";
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(Mac::LoadOrCreate(path).status().code(), absl::StatusCode::kFailedPrecondition);
}

kiln::v1::ArtifactBody SampleBody() {
  kiln::v1::ArtifactBody body;
  body.set_key(std::string(64, 'a'));
  body.set_compiler_version("v");
  body.set_kernel_binary(
      "\x7f"
      "ELF...");
  return body;
}

TEST(Mac, ClientWithDaemonKeyAcceptsArtifact) {
  Mac daemon(std::string(32, 'k'));
  kiln::v1::Artifact artifact = SignArtifact(daemon, SampleBody());
  absl::StatusOr<kiln::v1::ArtifactBody> body = VerifyArtifact(Mac(std::string(32, 'k')), artifact);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->kernel_binary(), SampleBody().kernel_binary());
}

TEST(Mac, ClientWithWrongKeyRefusesArtifact) {
  kiln::v1::Artifact artifact = SignArtifact(Mac(std::string(32, 'k')), SampleBody());
  EXPECT_EQ(VerifyArtifact(Mac(std::string(32, 'j')), artifact).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Mac, TamperedBodyIsRefused) {
  Mac mac(std::string(32, 'k'));
  kiln::v1::Artifact artifact = SignArtifact(mac, SampleBody());
  artifact.mutable_body()->back() ^= 1;
  EXPECT_EQ(VerifyArtifact(mac, artifact).status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace kiln::cache
