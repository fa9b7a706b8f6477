// PassLog: copies of the graph between passes, without constant data, and their zlib form in the
// artifact.
#include "compiler/passes/pass_log.h"

#include <zlib.h>

#include "absl/status/status.h"

namespace kiln::compiler {

void PassLog::Record(std::string_view pass, const kiln::v1::Graph& graph) {
  if (out_ == nullptr) return;
  kiln::v1::PassSnapshot* snapshot = out_->add_passes();
  snapshot->set_name(std::string(pass));
  kiln::v1::Graph* copy = snapshot->mutable_graph();
  *copy->mutable_inputs() = graph.inputs();
  // The data of a constant can be a large tensor; the plan carries it once already.
  for (const kiln::v1::Constant& c : graph.constants()) {
    *copy->add_constants()->mutable_value() = c.value();
  }
  *copy->mutable_nodes() = graph.nodes();
  *copy->mutable_outputs() = graph.outputs();
  copy->set_num_bound_inputs(graph.num_bound_inputs());
  std::string serialized = copy->SerializeAsString();
  const bool unchanged = recorded_ && serialized == last_;
  recorded_ = true;
  if (unchanged) {
    snapshot->clear_graph();
    snapshot->set_unchanged(true);
    return;
  }
  last_ = std::move(serialized);
}

std::string CompressPassSnapshots(const kiln::v1::PassSnapshots& snapshots) {
  const std::string raw = snapshots.SerializeAsString();
  uLongf size = compressBound(raw.size());
  std::string out(size, '\0');
  // Fails only for a too small buffer (compressBound rules it out) or out of memory.
  if (compress2(reinterpret_cast<Bytef*>(out.data()), &size,
                reinterpret_cast<const Bytef*>(raw.data()), raw.size(),
                Z_DEFAULT_COMPRESSION) != Z_OK) {
    return "";
  }
  out.resize(size);
  return out;
}

absl::StatusOr<kiln::v1::PassSnapshots> ReadPassSnapshots(std::string_view compressed) {
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK) return absl::InternalError("inflateInit failed");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  stream.avail_in = compressed.size();
  std::string raw;
  char chunk[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    stream.next_out = reinterpret_cast<Bytef*>(chunk);
    stream.avail_out = sizeof(chunk);
    rc = inflate(&stream, Z_NO_FLUSH);
    raw.append(chunk, sizeof(chunk) - stream.avail_out);
  }
  inflateEnd(&stream);
  if (rc != Z_STREAM_END) return absl::DataLossError("pass snapshots do not inflate");
  kiln::v1::PassSnapshots snapshots;
  if (!snapshots.ParseFromString(raw)) {
    return absl::DataLossError("pass snapshots do not parse");
  }
  return snapshots;
}

}  // namespace kiln::compiler
