// CudaGraphShapes: a plan with size symbols replayed as one CUDA graph per shape of its inputs,
// each recorded on that shape's first call into the process's one pool, bounded in number and
// in the memory the graphs hold.
#ifndef KILN_RUNTIME_CUDA_GRAPH_SHAPES_H_
#define KILN_RUNTIME_CUDA_GRAPH_SHAPES_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/cuda_graph_pool.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/plan_runtime.h"
#include "status.h"

namespace kiln::runtime {

// Policy. A call's shape is its inputs' dtypes, sizes and strides. The first call of a shape
// records a graph for it (a CudaGraphRunner: the same copies of inputs, outputs and prologue
// values, the same refusals) and later calls of that shape replay it; the plan's graphs share one
// copy of its prologue values. The graphs of all plans of the process share the pool's budget
// (CudaGraphPool::SetShapeBudget: graphs and bytes: each graph's static inputs and outputs, each
// plan's prologue copy once; a graph's intermediates are the pool's, shared by every graph). A new shape that would exceed it evicts this plan's least recently used
// graph when that graph sat unused for more than 4 * (graphs the plan holds) + 16 calls (a shape
// the program left); otherwise the new shape runs the plan without a graph. So shapes that come
// back in a cycle longer than the budget (up to four times it) keep the graphs they have instead
// of evicting each other before their turn comes (plain LRU would miss every call), and a
// program whose shapes drift still frees what it no longer uses. A plan that cannot be captured at all (host synchronisation,
// random numbers, parameter updates: CudaGraphRunner's refusals) runs without graphs, said once
// through `note`; so does every shape after kMaxFailures captures failed.
//
// Graphs pay only where launching the plan's work costs the host about as long as the GPU takes
// to run it (a decoder's step); a plan whose GPU work outlasts its launches (a large batch
// through BERT) gains nothing from a graph and would pay each new shape's recording. So the
// plan's first calls run without a graph and are timed: after the first (which pays one-time
// setup), kSamples calls give the GPU's time between two events around the run over the host's
// time for the run; a median below kLaunchBound records graphs per shape from then on, else the
// plan runs without graphs.
//
// Run may be called from several threads: the map is guarded, and a graph being replayed stays
// alive while another call evicts it.
class CudaGraphShapes {
 public:
  CudaGraphShapes(std::shared_ptr<const Plan> plan, std::shared_ptr<CudaGraphPool> pool);
  ~CudaGraphShapes();
  CudaGraphShapes(const CudaGraphShapes&) = delete;
  CudaGraphShapes& operator=(const CudaGraphShapes&) = delete;

  // Plan::Run's contract; *note as CudaGraphRunner::Run's.
  Status Run(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs,
             std::string* note);

  struct Stats {
    int graphs = 0;       // Graphs held now.
    int captures = 0;     // Graphs recorded, evicted ones included.
    int evictions = 0;    // Graphs evicted to make room for another shape.
    int64_t bytes = 0;    // Memory the graphs held now account for.
    bool disabled = false;  // No shape is recorded any more.
    // "measuring" (the first calls, timed), "record" (graphs per shape), or "plain" (the GPU's
    // work outlasts the launches: no graphs).
    std::string gate;
  };
  Stats stats() const;

  static constexpr int kMaxFailures = 3;
  static constexpr int kSamples = 3;
  static constexpr double kLaunchBound = 1.5;

 private:
  using Key = std::vector<int64_t>;
  struct Entry {
    std::shared_ptr<CudaGraphRunner> runner;
    std::list<Key>::iterator lru;  // Its place in lru_ (front: most recent).
    int64_t bytes = 0;             // Accounted with the pool once recorded.
    uint64_t last_call = 0;
  };
  // The shape of a call; false for one no graph can take (an input not dense from offset 0, or
  // undefined, or on another device).
  bool KeyOf(const std::vector<at::Tensor>& inputs, Key* key) const;
  // A call while measuring: run without a graph, timed; decides the gate once enough samples
  // completed.
  Status MeasuredRun(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs);
  // Under mutex_: the samples whose GPU time is known, and the gate once kSamples are.
  void Harvest();
  // Under mutex_: whether a new shape's graph is recorded now (room in the budget, made by an
  // idle graph if needed).
  bool Admit(const Key& key, const std::vector<at::Tensor>& inputs);
  // Under mutex_, after a new shape's first run: counts its graph against the budget, or drops
  // it (over the budget, or the capture failed).
  void Recorded(const Key& key, const std::shared_ptr<CudaGraphRunner>& runner,
                const std::string& graph_note, std::string* note);
  // Under mutex_: frees the least recently used graph if it sat unused long enough.
  bool EvictIdle();
  void Drop(std::map<Key, Entry>::iterator it);
  // Under mutex_: the shared prologue copy's bytes accounted as they are now.
  void AccountPrologue();

  const std::shared_ptr<const Plan> plan_;
  const std::shared_ptr<CudaGraphPool> pool_;
  const std::shared_ptr<PrologueCopies> prologue_;  // Shared by the runners.

  mutable std::mutex mutex_;  // Guards everything below.
  int64_t prologue_bytes_ = 0;  // Of prologue_, as accounted with the pool.
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;
  // Shapes whose graph did not fit the budget when recorded: run without one until a graph is
  // evicted (else every call of theirs would record a graph only to drop it).
  std::set<Key> too_big_;
  uint64_t calls_ = 0;
  int captures_ = 0;
  int evictions_ = 0;
  int failures_ = 0;
  int64_t bytes_ = 0;
  bool disabled_ = false;
  std::string pending_note_;
  enum class Gate { kMeasuring, kRecord, kPlain };
  Gate gate_ = Gate::kMeasuring;
  struct Sample {
    std::unique_ptr<c10::Event> start, end;  // Timing enabled (BACKEND_DEFAULT).
    double host_ms = 0;
  };
  std::vector<Sample> pending_;  // Timed runs whose GPU time is not known yet.
  std::vector<double> ratios_;   // GPU time over host time, of the runs measured.
  int timed_calls_ = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CUDA_GRAPH_SHAPES_H_
