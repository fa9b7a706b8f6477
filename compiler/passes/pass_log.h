// PassLog: the graph after each compiler pass, kept in the artifact (ArtifactBody.pass_snapshots)
// so that kiln.debug.artifact and KILN_LOG=codegen can show what every pass did.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kiln/v1/artifact.pb.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::compiler {

// Appends one PassSnapshot per recorded pass. A snapshot costs a copy of the graph without its
// constants' data and one serialization (to tell an unchanged graph); passes see no difference.
class PassLog {
 public:
  // Records nothing: for callers that want no snapshots.
  PassLog() = default;
  // Records into `out`, which must outlive the log.
  explicit PassLog(kiln::v1::PassSnapshots* out) : out_(out) {}

  // Records `graph` as the graph after `pass`: marked unchanged when it equals the graph of the
  // snapshot before.
  void Record(std::string_view pass, const kiln::v1::Graph& graph);

  // Records `graph` after `pass` and hands it back, so that a pipeline reads
  // g = log.After("dead code", EliminateDeadCode(g)).
  kiln::v1::Graph After(std::string_view pass, kiln::v1::Graph graph) {
    Record(pass, graph);
    return graph;
  }

 private:
  kiln::v1::PassSnapshots* out_ = nullptr;
  bool recorded_ = false;
  std::string last_;  // the graph of the latest snapshot, serialized
};

// `snapshots` as ArtifactBody.pass_snapshots holds them: serialized, then zlib-compressed.
// Empty (an artifact without snapshots) in the one case zlib fails: it cannot allocate.
std::string CompressPassSnapshots(const kiln::v1::PassSnapshots& snapshots);

// The snapshots in ArtifactBody.pass_snapshots bytes; an error for bytes that do not inflate
// or parse.
absl::StatusOr<kiln::v1::PassSnapshots> ReadPassSnapshots(std::string_view compressed);

}  // namespace kiln::compiler
