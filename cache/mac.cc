// HMAC-SHA256 signing and the key file the daemon creates on first start.
#include "cache/mac.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/sha256.h"

namespace kiln::cache {
namespace {

absl::Status ErrnoStatus(std::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(std::string(what), " ", path, ": ", std::strerror(errno)));
}

absl::StatusOr<std::string> ReadKey(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus("cannot open MAC key", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return ErrnoStatus("cannot stat MAC key", path);
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("MAC key ", path, " is readable by group or others; chmod 600 it"));
  }
  std::string key(Mac::kKeySize + 1, '\0');
  ssize_t n = ::read(fd, key.data(), key.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(Mac::kKeySize)) {
    return absl::FailedPreconditionError(
        absl::StrCat("MAC key ", path, " must hold exactly ", Mac::kKeySize, " bytes"));
  }
  key.resize(Mac::kKeySize);
  return key;
}

}  // namespace

absl::StatusOr<Mac> Mac::LoadOrCreate(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      return absl::UnavailableError(
          absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
    ::chmod(dir.c_str(), 0700);
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno != EEXIST) return ErrnoStatus("cannot create MAC key", path);
    auto key = ReadKey(path);
    if (!key.ok()) return key.status();
    return Mac(*std::move(key));
  }
  std::string key(kKeySize, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), kKeySize) != 1) {
    ::close(fd);
    ::unlink(path.c_str());
    return absl::InternalError("RAND_bytes failed");
  }
  bool written = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size());
  written = (::fsync(fd) == 0) && written;
  ::close(fd);
  if (!written) {
    ::unlink(path.c_str());
    return ErrnoStatus("cannot write MAC key", path);
  }
  return Mac(std::move(key));
}

std::string Mac::Sign(std::string_view data) const {
  std::string out(EVP_MAX_MD_SIZE, '\0');
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       reinterpret_cast<unsigned char*>(out.data()), &len);
  out.resize(len);
  return out;
}

bool Mac::Verify(std::string_view data, std::string_view mac) const {
  std::string expected = Sign(data);
  return mac.size() == expected.size() &&
         CRYPTO_memcmp(mac.data(), expected.data(), expected.size()) == 0;
}

std::string Mac::Fingerprint() const {
  return HexEncode(Sign("kiln key fingerprint v1")).substr(0, 16);
}

kiln::v1::Artifact SignArtifact(const Mac& mac, const kiln::v1::ArtifactBody& body) {
  kiln::v1::Artifact artifact;
  body.SerializeToString(artifact.mutable_body());
  artifact.set_mac(mac.Sign(artifact.body()));
  return artifact;
}

absl::StatusOr<kiln::v1::ArtifactBody> VerifyArtifact(const Mac& mac,
                                                      const kiln::v1::Artifact& artifact) {
  if (!mac.Verify(artifact.body(), artifact.mac())) {
    return absl::PermissionDeniedError("artifact MAC does not verify under this key");
  }
  kiln::v1::ArtifactBody body;
  if (!body.ParseFromString(artifact.body())) {
    return absl::DataLossError("signed artifact body does not parse");
  }
  return body;
}

}  // namespace kiln::cache
