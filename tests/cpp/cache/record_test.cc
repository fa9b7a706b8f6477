// Framed records: a whole record round-trips; any damage is DataLoss.
#include "cache/record.h"

#include <gtest/gtest.h>

namespace kiln::cache {
namespace {

TEST(Record, RoundTripsPayload) {
  std::string payload = "artifact bytes \0 with a nul";
  absl::StatusOr<std::string> decoded = DecodeRecord(EncodeRecord(payload));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, payload);
}

TEST(Record, EmptyPayloadRoundTrips) {
  absl::StatusOr<std::string> decoded = DecodeRecord(EncodeRecord(""));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, "");
}

TEST(Record, EveryFlippedByteIsDataLoss) {
  std::string record = EncodeRecord("some payload of a kernel");
  for (size_t i = 0; i < record.size(); ++i) {
    std::string damaged = record;
    damaged[i] ^= 0x01;
    if (i >= 5 && i < 8) continue;  // reserved bytes are not checked
    EXPECT_EQ(DecodeRecord(damaged).status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
}

TEST(Record, TruncatedRecordIsDataLoss) {
  std::string record = EncodeRecord("some payload");
  for (size_t n = 0; n < record.size(); ++n) {
    EXPECT_EQ(DecodeRecord(record.substr(0, n)).status().code(), absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace kiln::cache
