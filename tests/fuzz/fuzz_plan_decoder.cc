// libFuzzer entry for the client's ExecutionPlan decoder (client/runtime/plan_decoder.h), which
// reads the plan out of an artifact without libprotobuf. Beyond "no crash, no sanitizer report"
// (it must never read outside its input), it checks the decoder against libprotobuf: bytes that
// protobuf parses (into a plan whose steps all name a kind) decode, and to the same plan.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/v1/artifact.pb.h"
#include "runtime/plan_decoder.h"
#include "tests/cpp/support/plan_spec_from_proto.h"
#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string field that is not UTF-8; the fuzzer makes many.
  static google::protobuf::LogSilencer* quiet = new google::protobuf::LogSilencer();
  (void)quiet;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kiln::StatusOr<kiln::runtime::PlanSpec> decoded = kiln::runtime::DecodePlan(bytes);
  if (!decoded.ok()) {
    kiln::fuzz::Check(decoded.status().IsInvalidArgument(),
                      "refusal is not kInvalidArgument:", decoded.status().ToString());
    kiln::fuzz::Check(decoded.status().message().find("does not decode") != std::string::npos,
                      "refusal does not say what failed:", decoded.status().message());
  }
  kiln::v1::ExecutionPlan parsed;
  if (!parsed.ParseFromArray(data, static_cast<int>(size))) return 0;
  std::optional<kiln::runtime::PlanSpec> expected = kiln::testing::FromProto(parsed);
  if (!expected) {
    kiln::fuzz::Check(!decoded.ok(), "a step without a kind was accepted");
    return 0;
  }
  kiln::fuzz::Check(decoded.ok(),
                    "protobuf parses what DecodePlan refuses:", decoded.status().ToString());
  const std::string mine = kiln::testing::Dump(*decoded);
  const std::string theirs = kiln::testing::Dump(*expected);
  kiln::fuzz::Check(mine == theirs, "DecodePlan and protobuf disagree:", mine + "\n---\n" + theirs);
  return 0;
}
