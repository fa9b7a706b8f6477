// A plan with size symbols replayed as one CUDA graph per shape of its inputs, within the
// process's budget of such graphs.
#include "runtime/cuda_graph_shapes.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace kiln::runtime {

CudaGraphShapes::CudaGraphShapes(std::shared_ptr<const Plan> plan,
                                 std::shared_ptr<CudaGraphPool> pool)
    : plan_(std::move(plan)),
      pool_(std::move(pool)),
      prologue_(std::make_shared<PrologueCopies>()) {
  // The refusals that hold for every shape (the plan's ops, its updates): asked once.
  pending_note_ = CudaGraphRunner::Refusal(*plan_);
  disabled_ = !pending_note_.empty();
}

CudaGraphShapes::~CudaGraphShapes() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, entry] : entries_) {
    if (entry.bytes > 0) pool_->ReleaseShapeGraph(entry.bytes);
  }
  pool_->AdjustShapeBytes(-prologue_bytes_);
}

CudaGraphShapes::Stats CudaGraphShapes::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats out;
  out.graphs = static_cast<int>(entries_.size());
  out.captures = captures_;
  out.evictions = evictions_;
  out.bytes = bytes_;
  out.disabled = disabled_;
  out.gate = gate_ == Gate::kMeasuring ? "measuring" : gate_ == Gate::kRecord ? "record" : "plain";
  return out;
}

void CudaGraphShapes::Harvest() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!it->end->query()) {
      ++it;
      continue;
    }
    const double gpu_ms = it->start->elapsedTime(*it->end);
    ratios_.push_back(gpu_ms / std::max(it->host_ms, 1e-3));
    it = pending_.erase(it);
  }
  if (static_cast<int>(ratios_.size()) < kSamples) return;
  std::vector<double> sorted = ratios_;
  std::sort(sorted.begin(), sorted.end());
  gate_ = sorted[sorted.size() / 2] < kLaunchBound ? Gate::kRecord : Gate::kPlain;
  pending_.clear();
}

Status CudaGraphShapes::MeasuredRun(const std::vector<at::Tensor>& inputs,
                                    std::vector<at::Tensor>* outputs) {
  bool timed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The first call pays one-time setup (library handles, workspaces): not a sample.
    timed = timed_calls_++ > 0 &&
            static_cast<int>(pending_.size() + ratios_.size()) < kSamples;
  }
  if (!timed) return plan_->Run(inputs, outputs);
  const c10::DeviceIndex device = plan_->device().index();
  c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device);
  Sample sample;
  sample.start = std::make_unique<c10::Event>(c10::DeviceType::CUDA,
                                              c10::EventFlag::BACKEND_DEFAULT);
  sample.end = std::make_unique<c10::Event>(c10::DeviceType::CUDA,
                                            c10::EventFlag::BACKEND_DEFAULT);
  sample.start->record(stream);
  const auto begun = std::chrono::steady_clock::now();
  Status status = plan_->Run(inputs, outputs);
  sample.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begun).count();
  sample.end->record(stream);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mutex_);
  if (gate_ == Gate::kMeasuring) pending_.push_back(std::move(sample));
  return status;
}

bool CudaGraphShapes::KeyOf(const std::vector<at::Tensor>& inputs, Key* key) const {
  key->clear();
  for (const at::Tensor& t : inputs) {
    if (!GraphCopyable(t) || t.device() != plan_->device()) return false;
    key->push_back(static_cast<int64_t>(t.scalar_type()));
    key->push_back(t.dim());
    for (int64_t d = 0; d < t.dim(); ++d) {
      key->push_back(t.size(d));
      key->push_back(t.stride(d));
    }
  }
  return true;
}

void CudaGraphShapes::Drop(std::map<Key, Entry>::iterator it) {
  if (it->second.bytes > 0) {
    pool_->ReleaseShapeGraph(it->second.bytes);
    bytes_ -= it->second.bytes;
  }
  lru_.erase(it->second.lru);
  entries_.erase(it);  // A replay under way keeps its runner (shared_ptr).
}

bool CudaGraphShapes::EvictIdle() {
  if (lru_.empty()) return false;
  auto it = entries_.find(lru_.back());
  // Idle for four times as many calls as the plan holds graphs (and 16 more): a shape the
  // program left behind, not one of a cycle of shapes longer than the budget.
  const uint64_t idle = calls_ - it->second.last_call;
  if (idle <= 4 * static_cast<uint64_t>(entries_.size()) + 16) return false;
  Drop(it);
  ++evictions_;
  too_big_.clear();  // Room was made: they may fit now.
  return true;
}

Status CudaGraphShapes::Run(const std::vector<at::Tensor>& inputs,
                            std::vector<at::Tensor>* outputs, std::string* note) {
  // What this call does is decided under the lock; the plan or its graph runs outside it.
  enum class Action { kPlain, kMeasure, kReplay, kRecord } action = Action::kPlain;
  std::shared_ptr<CudaGraphRunner> runner;
  Key key;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gate_ == Gate::kMeasuring && !disabled_) Harvest();
    if (disabled_) {
      if (!pending_note_.empty()) *note = std::move(pending_note_);
      pending_note_.clear();
    } else if (gate_ == Gate::kMeasuring) {
      action = Action::kMeasure;
    } else if (gate_ == Gate::kRecord && KeyOf(inputs, &key)) {
      ++calls_;
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        it->second.last_call = calls_;
        runner = it->second.runner;
        action = Action::kReplay;
      } else if (Admit(key, inputs)) {
        runner = std::make_shared<CudaGraphRunner>(plan_, pool_, prologue_);
        lru_.push_front(key);
        Entry entry;
        entry.runner = runner;
        entry.lru = lru_.begin();
        entry.last_call = calls_;
        entries_.emplace(key, std::move(entry));
        action = Action::kRecord;
      }
    }
  }
  switch (action) {
    case Action::kPlain:
      return plan_->Run(inputs, outputs);
    case Action::kMeasure:
      return MeasuredRun(inputs, outputs);
    case Action::kReplay:
    case Action::kRecord:
      break;
  }
  std::string graph_note;
  Status status = runner->Run(inputs, outputs, &graph_note);
  if (action == Action::kReplay) return status;
  std::lock_guard<std::mutex> lock(mutex_);
  Recorded(key, runner, graph_note, note);
  return status;
}

bool CudaGraphShapes::Admit(const Key& key, const std::vector<at::Tensor>& inputs) {
  // Recorded when one more graph fits (its bytes are known once it is recorded; those of its
  // inputs now), after an idle graph made room if needed.
  if (too_big_.count(key) != 0) return false;
  int64_t input_bytes = 0;
  for (const at::Tensor& t : inputs) input_bytes += static_cast<int64_t>(t.nbytes());
  return pool_->ShapeGraphFits(input_bytes) ||
         (EvictIdle() && pool_->ShapeGraphFits(input_bytes));
}

void CudaGraphShapes::Recorded(const Key& key, const std::shared_ptr<CudaGraphRunner>& runner,
                               const std::string& graph_note, std::string* note) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.runner != runner) return;  // evicted meanwhile
  if (!runner->captured()) {
    // The capture failed: this shape runs without a graph (its runner says so from now on).
    if (++failures_ >= kMaxFailures && !disabled_) {
      disabled_ = true;
      *note = graph_note + " (" + std::to_string(failures_) +
              " shapes failed to capture: no more shapes are recorded)";
    }
    return;
  }
  ++captures_;
  AccountPrologue();
  const int64_t bytes = runner->bytes();
  while (!pool_->ReserveShapeGraph(bytes)) {
    // Over the budget now that its size is known: an idle graph makes room, or this one is
    // given up and its shape runs without a graph until room is made.
    if (lru_.back() == it->first || !EvictIdle()) {
      Drop(it);
      too_big_.insert(key);
      return;
    }
  }
  it->second.bytes = bytes;
  bytes_ += bytes;
}

void CudaGraphShapes::AccountPrologue() {
  // A new copy is made when the values' layouts change; the old one lives on only until the
  // graphs that read it are captured again.
  const int64_t now = prologue_->bytes();
  if (now == prologue_bytes_) return;
  pool_->AdjustShapeBytes(now - prologue_bytes_);
  bytes_ += now - prologue_bytes_;
  prologue_bytes_ = now;
}

}  // namespace kiln::runtime
