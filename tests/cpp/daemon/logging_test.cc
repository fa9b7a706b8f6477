// kilnd's log file is rotated: a detached kilnd that logs without end keeps at most
// kLogFileBytes in each of the file and its kLogFilesKept older copies, the newest lines in the
// file itself.
#include "daemon/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "tests/cpp/support/temp_dir.h"

namespace kiln::daemon {
namespace {

namespace fs = std::filesystem;

TEST(KilndLogging, DetachedLogFileIsRotatedAndBounded) {
  kiln::testing::TempDir dir;
  const std::string log = dir.Sub("kilnd.log");
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  ASSERT_TRUE(SetUpLogging(/*detached=*/true, log, "info").ok());
  // Twice the files' whole budget, one numbered line at a time.
  const std::string filler(200, 'x');
  const size_t lines = 2 * (kLogFilesKept + 1) * kLogFileBytes / filler.size();
  for (size_t i = 0; i < lines; ++i) spdlog::info("line {} {}", i, filler);
  spdlog::info("the last line");
  FlushLogs();
  spdlog::set_default_logger(previous);

  ASSERT_TRUE(fs::exists(log));
  for (size_t k = 1; k <= kLogFilesKept; ++k) {
    const std::string older = dir.Sub("kilnd." + std::to_string(k) + ".log");
    ASSERT_TRUE(fs::exists(older)) << older;
    EXPECT_LE(fs::file_size(older), kLogFileBytes) << older;
  }
  EXPECT_FALSE(fs::exists(dir.Sub("kilnd." + std::to_string(kLogFilesKept + 1) + ".log")));
  EXPECT_LE(fs::file_size(log), kLogFileBytes);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("the last line"), std::string::npos);
  EXPECT_EQ(text.find("line 0 "), std::string::npos);  // the oldest lines were rotated away
}

}  // namespace
}  // namespace kiln::daemon
