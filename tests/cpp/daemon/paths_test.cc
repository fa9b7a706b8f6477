// kiln's default paths (daemon/paths.h): the rule kilnd and the client share.
#include "daemon/paths.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

namespace kiln::paths {
namespace {

Environment MapEnvironment(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) {
    auto it = values.find(name);
    return it == values.end() ? std::string() : it->second;
  };
}

TEST(KilnPaths, HomeCacheWhenNothingIsSet) {
  KilnPaths p = ResolvePaths({}, MapEnvironment({{"HOME", "/home/u"}}));
  EXPECT_EQ(p.cache_dir, "/home/u/.cache/kiln");
  EXPECT_EQ(p.socket, "/home/u/.cache/kiln/kilnd.sock");
  EXPECT_EQ(p.mac_key_file, "/home/u/.cache/kiln/mac.key");
  EXPECT_EQ(p.log_file, "/home/u/.cache/kiln/kilnd.log");
  EXPECT_EQ(ResolvePaths({}, MapEnvironment({})).cache_dir, "/tmp/.cache/kiln");
}

TEST(KilnPaths, XdgDirectoriesMoveTheCacheAndTheSocket) {
  KilnPaths p = ResolvePaths({}, MapEnvironment({{"HOME", "/home/u"},
                                                 {"XDG_CACHE_HOME", "/xdg/cache"},
                                                 {"XDG_RUNTIME_DIR", "/run/user/7"}}));
  EXPECT_EQ(p.cache_dir, "/xdg/cache/kiln");
  EXPECT_EQ(p.socket, "/run/user/7/kiln/kilnd.sock");
  EXPECT_EQ(p.mac_key_file, "/xdg/cache/kiln/mac.key");
}

TEST(KilnPaths, KilnCacheDirIsAPrivateCacheWithItsOwnDaemon) {
  KilnPaths p = ResolvePaths({}, MapEnvironment({{"KILN_CACHE_DIR", "/private/c"},
                                                 {"XDG_CACHE_HOME", "/xdg/cache"},
                                                 {"XDG_RUNTIME_DIR", "/run/user/7"}}));
  EXPECT_EQ(p.cache_dir, "/private/c");
  EXPECT_EQ(p.socket, "/private/c/kilnd.sock");
  EXPECT_EQ(p.log_file, "/private/c/kilnd.log");
}

TEST(KilnPaths, MacKeyFileFromTheEnvironment) {
  KilnPaths p = ResolvePaths({}, MapEnvironment({{"HOME", "/h"}, {"KILN_MAC_KEY_FILE", "/k/key"}}));
  EXPECT_EQ(p.mac_key_file, "/k/key");
  EXPECT_EQ(p.cache_dir, "/h/.cache/kiln");
}

TEST(KilnPaths, EmptyValuesCountAsUnset) {
  KilnPaths p = ResolvePaths({}, MapEnvironment({{"HOME", "/h"},
                                                 {"KILN_CACHE_DIR", ""},
                                                 {"XDG_CACHE_HOME", ""},
                                                 {"XDG_RUNTIME_DIR", ""},
                                                 {"KILN_MAC_KEY_FILE", ""}}));
  EXPECT_EQ(p.cache_dir, "/h/.cache/kiln");
  EXPECT_EQ(p.socket, "/h/.cache/kiln/kilnd.sock");
  EXPECT_EQ(p.mac_key_file, "/h/.cache/kiln/mac.key");
}

TEST(KilnPaths, GivenPathsWinAndAGivenCacheDirDoesNotMoveTheSocket) {
  auto env = MapEnvironment({{"HOME", "/h"}, {"XDG_RUNTIME_DIR", "/run/user/7"}});
  KilnPaths given;
  given.cache_dir = "/flag/cache";
  KilnPaths p = ResolvePaths(given, env);
  EXPECT_EQ(p.cache_dir, "/flag/cache");
  EXPECT_EQ(p.socket, "/run/user/7/kiln/kilnd.sock");
  EXPECT_EQ(p.mac_key_file, "/flag/cache/mac.key");
  EXPECT_EQ(p.log_file, "/flag/cache/kilnd.log");
  KilnPaths q = ResolvePaths({"/c", "/s.sock", "/k", "/l"}, env);
  EXPECT_EQ(q.socket, "/s.sock");
  EXPECT_EQ(q.mac_key_file, "/k");
  EXPECT_EQ(q.log_file, "/l");
}

TEST(KilnPaths, RelativePathsBecomeAbsoluteAndNormal) {
  KilnPaths p = ResolvePaths({}, MapEnvironment({{"KILN_CACHE_DIR", "rel/./c/../cache"}}));
  const std::filesystem::path cwd = std::filesystem::current_path();
  EXPECT_EQ(p.cache_dir, (cwd / "rel/cache").string());
  EXPECT_EQ(p.socket, (cwd / "rel/cache/kilnd.sock").string());
  EXPECT_EQ(AbsolutePath(""), "");
}

}  // namespace
}  // namespace kiln::paths
