// What kilnd does to the file system: the directories it creates (0700) and those it only uses
// (their modes untouched; another user's refused), the socket path (only a socket is ever
// replaced), and its log (a detached daemon's file in a fresh cache directory, the journal's
// format under systemd).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/cpp/support/kilnd_process.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::daemon {
namespace {

using kiln::testing::KilndForTestsPath;
using kiln::testing::RunKilnd;
using kiln::testing::TempDir;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  return st.st_mode & 07777;
}

TEST(KilndFiles, DetachedDaemonLogsToAFileInTheFreshCacheDirectoryItCreates) {
  TempDir dir;
  const std::string cache = dir.Sub("fresh/nested/cache");
  const std::string socket = dir.Sub("run/kilnd.sock");
  auto [code, out] = RunKilnd(
      {"--cache-dir", cache, "--socket", socket, "--idle-exit", "30", "--log-level", "info"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(ModeOf(cache), 0700u);
  EXPECT_EQ(ModeOf(dir.Sub("fresh")), 0700u);
  EXPECT_EQ(ModeOf(dir.Sub("run")), 0700u);
  EXPECT_NE(ReadFile(cache + "/kilnd.log").find("serving on " + socket), std::string::npos);
  ASSERT_EQ(RunKilnd({"--stop", "--socket", socket}).first, 0);
  EXPECT_TRUE(kiln::testing::WaitFor([&] {
    return ReadFile(cache + "/kilnd.log").find("stopped") != std::string::npos;
  })) << ReadFile(cache + "/kilnd.log");
  EXPECT_EQ(ModeOf(cache + "/kilnd.log"), 0600u);
  EXPECT_EQ(ModeOf(cache + "/artifacts"), 0700u);  // RocksDB's folder, under kilnd's umask
}

TEST(KilndFiles, DetachedDaemonThatCannotStartSaysWhyAndLogsIt) {
  TempDir dir;
  std::ofstream(dir.Sub("not-a-socket")) << "precious";
  auto [code, out] =
      RunKilnd({"--cache-dir", dir.Sub("cache"), "--socket", dir.Sub("not-a-socket")});
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("refusing --socket"), std::string::npos) << out;
  EXPECT_NE(ReadFile(dir.Sub("cache/kilnd.log")).find("refusing --socket"), std::string::npos);
  EXPECT_EQ(ReadFile(dir.Sub("not-a-socket")), "precious");
}

TEST(KilndFiles, SharedDirectoryKeepsItsModeAndIsRefusedForTheSocket) {
  TempDir dir;
  const std::string shared = dir.Sub("tmp");  // a stand-in for /tmp
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);

  // As the cache directory's parent and as the cache directory itself: used, never chmodded.
  auto [code, out] =
      RunKilnd({"--cache-dir", shared, "--socket", dir.Sub("run/kilnd.sock"), "--idle-exit", "30"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(RunKilnd({"--stop", "--socket", dir.Sub("run/kilnd.sock")}).first, 0);
  EXPECT_EQ(ModeOf(shared), 01777u);

  // As the socket's directory: anyone could replace the socket there.
  auto [refused, why] =
      RunKilnd({"--foreground", "--cache-dir", dir.Sub("cache"), "--socket", shared + "/k.sock"});
  EXPECT_NE(refused, 0);
  EXPECT_NE(why.find("group or others may write it"), std::string::npos) << why;
  EXPECT_EQ(ModeOf(shared), 01777u);
}

TEST(KilndFiles, DirectoryOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  TempDir dir;
  const std::string theirs = dir.Sub("theirs");
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  auto [code, out] =
      RunKilnd({"--foreground", "--cache-dir", theirs, "--socket", dir.Sub("run/kilnd.sock")});
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("belongs to uid 65534"), std::string::npos) << out;
  EXPECT_EQ(ModeOf(theirs), 0755u);
}

TEST(KilndFiles, StaleSocketIsReplacedButNothingElseIsDeleted) {
  TempDir dir;
  const std::string socket = dir.Sub("run/kilnd.sock");
  {
    kiln::testing::KilndProcess kilnd(dir.path(), 0);
    ASSERT_TRUE(kilnd.WaitServing());
    kilnd.Kill(SIGKILL);  // leaves its socket behind
  }
  kiln::testing::KilndProcess restarted(dir.path(), 0);
  EXPECT_TRUE(restarted.WaitServing());
  restarted.Kill(SIGKILL);

  std::filesystem::remove(socket);
  std::filesystem::create_directory(socket);  // a directory where the socket would go
  auto [code, out] =
      RunKilnd({"--foreground", "--cache-dir", dir.Sub("cache"), "--socket", socket});
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("a directory is there"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::is_directory(socket));
}

TEST(KilndFiles, ForegroundUnderSystemdLogsWithJournalPriorities) {
  TempDir dir;
  std::ofstream(dir.Sub("not-a-socket")) << "x";
  const std::string err = dir.Sub("journal");
  std::ofstream(err).close();
  struct stat st {};
  ASSERT_EQ(::stat(err.c_str(), &st), 0);
  const std::string command = "JOURNAL_STREAM=" + std::to_string(st.st_dev) + ":" +
                              std::to_string(st.st_ino) + " " + KilndForTestsPath() +
                              " --foreground --cache-dir " + dir.Sub("cache") + " --socket " +
                              dir.Sub("not-a-socket") + " 2>>" + err;
  EXPECT_NE(std::system(command.c_str()), 0);
  const std::string journal = ReadFile(err);
  EXPECT_EQ(journal.rfind("<3>cannot start: ", 0), 0u) << journal;
}

}  // namespace
}  // namespace kiln::daemon
