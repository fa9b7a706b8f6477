// CudaDriver: a driver library that is absent, or lacks an entry point, is a clear error (never a
// crash), and the process's driver gives the same answer every time it is asked.
#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

namespace kiln::runtime {
namespace {

TEST(CudaDriverTest, AbsentLibraryIsAnIOErrorNamingIt) {
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Load("libkiln-no-such-driver.so.1");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), StatusCode::kIOError);
  EXPECT_NE(driver.status().message().find("cannot load the CUDA driver libkiln-no-such-driver"),
            std::string::npos)
      << driver.status().message();
}

TEST(CudaDriverTest, LibraryWithoutTheEntryPointsIsAnIOErrorNamingTheFirstMissing) {
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Load("libm.so.6");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), StatusCode::kIOError);
  EXPECT_NE(driver.status().message().find("does not export cuInit"), std::string::npos)
      << driver.status().message();
}

TEST(CudaDriverTest, ProcessDriverIsLoadedOnceAndAnswersAlike) {
  StatusOr<const CudaDriver*> first = CudaDriver::Process();
  StatusOr<const CudaDriver*> second = CudaDriver::Process();
  ASSERT_EQ(first.ok(), second.ok());
  if (first.ok()) {
    EXPECT_EQ(*first, *second);
    return;
  }
  EXPECT_EQ(first.status().message(), second.status().message());
  void* present = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (present == nullptr) {
    EXPECT_NE(first.status().message().find("libcuda.so.1"), std::string::npos)
        << first.status().message();
  } else {
    ::dlclose(present);  // A driver without a usable GPU: cuInit's error.
    EXPECT_NE(first.status().message().find("cuInit"), std::string::npos)
        << first.status().message();
  }
}

}  // namespace
}  // namespace kiln::runtime
