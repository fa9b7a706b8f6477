// The compile-time histogram: which bucket a sample lands in, and what a snapshot adds up to.
#include "daemon/latency_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kiln::daemon {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(LatencyHistogram, BucketsIncludeTheirUpperBoundAndAreCumulative) {
  LatencyHistogram histogram;
  histogram.Record(milliseconds(10));      // exactly the first bound
  histogram.Record(microseconds(10'001));  // just above it
  histogram.Record(seconds(2));            // 2.5 s bucket
  histogram.Record(seconds(301));          // above every bound
  LatencyHistogram::Snapshot snapshot = histogram.Read();
  EXPECT_EQ(snapshot.count, 4u);
  EXPECT_EQ(snapshot.sum_micros, 10'000u + 10'001u + 2'000'000u + 301'000'000u);
  EXPECT_EQ(snapshot.cumulative[0], 1u);      // <= 0.01 s
  EXPECT_EQ(snapshot.cumulative[1], 2u);      // <= 0.025 s
  EXPECT_EQ(snapshot.cumulative[6], 2u);      // <= 1 s
  EXPECT_EQ(snapshot.cumulative[7], 3u);      // <= 2.5 s
  EXPECT_EQ(snapshot.cumulative.back(), 3u);  // <= 300 s: the 301 s compile only in the count
}

TEST(LatencyHistogram, BoundsRunFromTenMillisecondsToFiveMinutesInOrder) {
  EXPECT_EQ(LatencyHistogram::kBounds.front(), 0.01);
  EXPECT_EQ(LatencyHistogram::kBounds.back(), 300);
  EXPECT_TRUE(std::is_sorted(LatencyHistogram::kBounds.begin(), LatencyHistogram::kBounds.end()));
  EXPECT_EQ(LatencyHistogram().Read().count, 0u);
}

}  // namespace
}  // namespace kiln::daemon
