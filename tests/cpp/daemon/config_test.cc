// kilnd's command line and config file: defaults, precedence, refusals.
#include "daemon/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/cpp/support/temp_dir.h"

namespace kiln::daemon {
namespace {

using kiln::testing::TempDir;

TEST(KilndConfig, DefaultsComeFromTheXdgEnvironment) {
  TempDir dir;
  ::unsetenv("KILN_CACHE_DIR");
  ::unsetenv("KILN_MAC_KEY_FILE");
  ::setenv("XDG_RUNTIME_DIR", dir.Sub("run").c_str(), 1);
  ::setenv("XDG_CACHE_HOME", dir.Sub("cache").c_str(), 1);
  auto parsed = ParseCommandLine({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->command, Command::kServe);
  EXPECT_EQ(parsed->config.socket_path, dir.Sub("run/kiln/kilnd.sock"));
  EXPECT_EQ(parsed->config.cache_dir, dir.Sub("cache/kiln"));
  EXPECT_EQ(parsed->config.mac_key_file, dir.Sub("cache/kiln/mac.key"));
  EXPECT_GT(parsed->config.workers, 0);
  ::unsetenv("XDG_RUNTIME_DIR");
  auto fallback = ParseCommandLine({});
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->config.socket_path, dir.Sub("cache/kiln/kilnd.sock"));
  ::unsetenv("XDG_CACHE_HOME");
}

TEST(KilndConfig, KilnCacheDirMovesTheCacheAndTheSocketUnlessFlagsSayOtherwise) {
  TempDir dir;
  ::setenv("XDG_RUNTIME_DIR", dir.Sub("run").c_str(), 1);
  ::setenv("KILN_CACHE_DIR", dir.Sub("private").c_str(), 1);
  ::setenv("KILN_MAC_KEY_FILE", dir.Sub("key").c_str(), 1);
  auto parsed = ParseCommandLine({"--print-paths"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->command, Command::kPrintPaths);
  EXPECT_EQ(PathsText(parsed->config), "cache-dir=" + dir.Sub("private") +
                                           "\nsocket=" + dir.Sub("private/kilnd.sock") +
                                           "\nmac-key-file=" + dir.Sub("key") +
                                           "\nlog-file=" + dir.Sub("private/kilnd.log") + "\n");
  auto flags = ParseCommandLine({"--print-paths", "--cache-dir", dir.Sub("c"), "--socket",
                                 dir.Sub("s.sock"), "--mac-key-file", dir.Sub("k")});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->config.cache_dir, dir.Sub("c"));
  EXPECT_EQ(flags->config.socket_path, dir.Sub("s.sock"));
  EXPECT_EQ(flags->config.mac_key_file, dir.Sub("k"));
  EXPECT_EQ(flags->config.log_file, dir.Sub("c/kilnd.log"));
  auto log_file = ParseCommandLine({"--log-file", dir.Sub("k.log")});
  ASSERT_TRUE(log_file.ok()) << log_file.status();
  EXPECT_EQ(log_file->config.log_file, dir.Sub("k.log"));
  ::unsetenv("XDG_RUNTIME_DIR");
  ::unsetenv("KILN_CACHE_DIR");
  ::unsetenv("KILN_MAC_KEY_FILE");
}

TEST(KilndConfig, FlagsOverrideTheConfigFile) {
  TempDir dir;
  std::ofstream(dir.Sub("kilnd.conf")) << "# kilnd settings\n"
                                       << "workers = 3\n"
                                       << "idle_exit=600   # ten minutes\n"
                                       << "frozen = true\n"
                                       << "redis = 10.0.0.1:6379\n";
  auto parsed = ParseCommandLine({"--config", dir.Sub("kilnd.conf"), "--workers=5", "--stats"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->command, Command::kStats);
  EXPECT_EQ(parsed->config.workers, 5);
  EXPECT_EQ(parsed->config.idle_exit_seconds, 600);
  EXPECT_TRUE(parsed->config.frozen);
  EXPECT_EQ(parsed->config.redis, "10.0.0.1:6379");
}

TEST(KilndConfig, RelativePathsBecomeAbsolute) {
  ::unsetenv("KILN_MAC_KEY_FILE");
  auto parsed = ParseCommandLine({"--cache-dir", "rel/cache", "--socket", "rel/../s.sock"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.cache_dir, (std::filesystem::current_path() / "rel/cache").string());
  EXPECT_EQ(parsed->config.socket_path, (std::filesystem::current_path() / "s.sock").string());
  EXPECT_EQ(parsed->config.mac_key_file,
            (std::filesystem::current_path() / "rel/cache/mac.key").string());
}

TEST(KilndConfig, RefusesUnknownOptionsAndBadValues) {
  EXPECT_FALSE(ParseCommandLine({"--no-such-flag", "1"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--workers", "many"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--listen", "http://x:1"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--queue-limit", "0"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--log-level", "loud"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--config", "/nonexistent/kilnd.conf"}).ok());
}

TEST(KilndConfig, RedisAuthAndTlsOptionsNeedRedisAndGoTogether) {
  auto parsed = ParseCommandLine({"--redis", "cache:6380", "--redis-tls", "--redis-tls-ca",
                                  "ca.pem", "--redis-user", "kilnd", "--redis-password-file", "pw",
                                  "--redis-timeout-ms", "250"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->config.redis_tls);
  EXPECT_EQ(parsed->config.redis_user, "kilnd");
  EXPECT_EQ(parsed->config.redis_timeout_ms, 250);
  EXPECT_EQ(parsed->config.redis_tls_ca, (std::filesystem::current_path() / "ca.pem").string());
  EXPECT_FALSE(ParseCommandLine({"--redis-tls"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--redis-password-file", "pw"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--redis", "c:1", "--redis-tls-cert", "c.pem"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--redis", "c:1", "--redis-timeout-ms", "0"}).ok());
}

TEST(KilndConfig, LeaseWaitIsMinutesByDefaultZeroTurnsLeasesOffAndAnHourIsTheMost) {
  auto defaults = ParseCommandLine({});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->config.redis_lease_wait_ms, 180'000);
  EXPECT_EQ(defaults->config.redis_lease_ttl_ms, 10'000);
  auto parsed = ParseCommandLine({"--redis-lease-wait-ms", "0", "--redis-lease-ttl-ms=2000"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.redis_lease_wait_ms, 0);
  EXPECT_EQ(parsed->config.redis_lease_ttl_ms, 2'000);
  EXPECT_TRUE(ParseCommandLine({"--redis-lease-wait-ms", "3600000"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--redis-lease-wait-ms", "3600001"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--redis-lease-wait-ms", "-1"}).ok());
  EXPECT_FALSE(ParseCommandLine({"--redis-lease-ttl-ms", "99"}).ok());
}

TEST(KilndConfig, MetricsListenIsOffByDefaultAndAPortAloneMeansLoopback) {
  auto defaults = ParseCommandLine({});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->config.metrics_listen, "");
  for (const auto& [given, bound] :
       std::vector<std::pair<std::string, std::string>>{{"9464", "127.0.0.1:9464"},
                                                        {":9464", "127.0.0.1:9464"},
                                                        {"localhost:9464", "127.0.0.1:9464"},
                                                        {"0.0.0.0:9464", "0.0.0.0:9464"},
                                                        {"10.1.2.3:0", "10.1.2.3:0"}}) {
    auto parsed = ParseCommandLine({"--metrics-listen", given});
    ASSERT_TRUE(parsed.ok()) << given << ": " << parsed.status();
    EXPECT_EQ(parsed->config.metrics_listen, bound) << given;
  }
  TempDir dir;
  std::ofstream(dir.Sub("kilnd.conf")) << "metrics_listen = 192.168.0.7:9100\n";
  auto file = ParseCommandLine({"--config", dir.Sub("kilnd.conf")});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->config.metrics_listen, "192.168.0.7:9100");
}

TEST(KilndConfig, MetricsListenRefusesWhatCivetwebWouldMisread) {
  for (const char* bad : {"999.1.1.1:9464", "metrics.internal:9464", "[::1]:9464", "::1:9464",
                          "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                          "127.0.0.1:9464s", "http://127.0.0.1:9464"}) {
    auto parsed = ParseCommandLine({"--metrics-listen", bad});
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find(std::string("--metrics-listen ") + bad),
              std::string::npos)
        << parsed.status();
  }
  EXPECT_NE(UsageText().find("--metrics-listen"), std::string::npos);
}

}  // namespace
}  // namespace kiln::daemon
