// kilnd as a real process: kill -9 during a compile loses nothing that was cached, SIGTERM
// drains the compile in flight, and the --stats / --stop / detached-start command lines work.
#include "tests/cpp/support/kilnd_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <future>

#include "tests/cpp/support/graphs.h"
#include "tests/cpp/support/temp_dir.h"

namespace kiln::daemon {
namespace {

using kiln::testing::KilndProcess;
using kiln::testing::MakeRequest;
using kiln::testing::RunKilnd;
using kiln::testing::TempDir;
using kiln::testing::WaitFor;

TEST(KilndProcess, KillDashNineDuringACompileThenRestartServesWhatWasCached) {
  TempDir dir;
  kiln::v1::CompileResponse cached;
  {
    KilndProcess kilnd(dir.path(), 600);
    ASSERT_TRUE(kilnd.WaitServing());
    ASSERT_TRUE(kilnd.Compile(MakeRequest(0), &cached).ok());
    ASSERT_TRUE(cached.has_artifact());
    auto in_flight = std::async(std::launch::async, [&] {
      kiln::v1::CompileResponse response;
      return kilnd.Compile(MakeRequest(1), &response);
    });
    ASSERT_TRUE(WaitFor([&] { return kilnd.Stats().in_flight() == 1; }));
    kilnd.Kill(SIGKILL);
    EXPECT_FALSE(in_flight.get().ok());
  }
  KilndProcess restarted(dir.path(), 600);
  ASSERT_TRUE(restarted.WaitServing());
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(restarted.Compile(MakeRequest(0), &response).ok());
  EXPECT_TRUE(response.cache_hit());
  EXPECT_EQ(response.artifact().SerializeAsString(), cached.artifact().SerializeAsString());
  EXPECT_EQ(restarted.Stats().compiles(), 0u);
  ASSERT_TRUE(restarted.Compile(MakeRequest(1), &response).ok());  // the killed compile, redone
  EXPECT_FALSE(response.cache_hit());
  EXPECT_EQ(restarted.Stats().compiles(), 1u);
}

TEST(KilndProcess, SigtermDrainsTheCompileInFlightThenExits) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), 500);
  ASSERT_TRUE(kilnd.WaitServing());
  auto in_flight = std::async(std::launch::async, [&] {
    kiln::v1::CompileResponse response;
    grpc::Status status = kilnd.Compile(MakeRequest(), &response);
    return status.ok() && response.has_artifact();
  });
  ASSERT_TRUE(WaitFor([&] { return kilnd.Stats().in_flight() == 1; }));
  kilnd.Kill(SIGTERM);
  EXPECT_TRUE(in_flight.get());
  std::optional<int> status = kilnd.WaitExit();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);

  KilndProcess restarted(dir.path(), 0);
  ASSERT_TRUE(restarted.WaitServing());
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(restarted.Compile(MakeRequest(), &response).ok());
  EXPECT_TRUE(response.cache_hit());
}

TEST(KilndProcess, StatsAndStopCommandsTalkToTheRunningDaemon) {
  TempDir dir;
  KilndProcess kilnd(dir.path(), 0);
  ASSERT_TRUE(kilnd.WaitServing());
  kiln::v1::CompileResponse response;
  ASSERT_TRUE(kilnd.Compile(MakeRequest(), &response).ok());
  auto [code, out] = RunKilnd({"--stats", "--socket", kilnd.socket()});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("compiles: 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("misses: 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("queue_depth: 0\n"), std::string::npos) << out;
  auto [stop_code, stop_out] = RunKilnd({"--stop", "--socket", kilnd.socket()});
  EXPECT_EQ(stop_code, 0) << stop_out;
  std::optional<int> status = kilnd.WaitExit();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  EXPECT_NE(RunKilnd({"--stats", "--socket", kilnd.socket()}).first, 0);
}

TEST(KilndProcess, DetachedStartReturnsOnceServingAndRefusesASecondDaemon) {
  TempDir dir;
  const std::string socket = dir.Sub("run/kilnd.sock");
  std::vector<std::string> serve = {"--cache-dir", dir.Sub("cache"), "--socket",
                                    socket,        "--idle-exit",    "30"};
  auto [code, out] = RunKilnd(serve);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(RunKilnd({"--stats", "--socket", socket}).first, 0);  // serving as soon as it returned
  auto [second, second_out] = RunKilnd(serve);
  EXPECT_NE(second, 0);
  EXPECT_NE(second_out.find("another kilnd"), std::string::npos) << second_out;
  EXPECT_EQ(RunKilnd({"--stop", "--socket", socket}).first, 0);
}

TEST(KilndProcess, TcpWithoutTlsIsRefusedAtStart) {
  TempDir dir;
  auto [code, out] = RunKilnd({"--foreground", "--cache-dir", dir.Sub("cache"), "--socket",
                               dir.Sub("run/kilnd.sock"), "--listen", "tcp://127.0.0.1:0"});
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("refusing a TCP listener"), std::string::npos) << out;
}

}  // namespace
}  // namespace kiln::daemon
