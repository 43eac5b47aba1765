// metrics::Registry: samplerd's own small metrics library. Counters, gauges and histograms in
// labelled families, and gauges computed by a callback at scrape time, rendered in the
// Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Why not prometheus-cpp: Debian 12 does not package it, and the build is offline. What samplerd
// needs is small: a few families, label values escaped, histograms with fixed buckets.
//
// Usage:
//   metrics::Registry registry;
//   auto* rpcs = registry.AddCounter("samplerd_rpcs_total", "RPCs handled.", {"method", "code"});
//   std::shared_ptr<metrics::Counter> ok = rpcs->WithLabels({"GetJob", "OK"});  // once
//   ok->Increment();                                                            // hot path
//   std::string text = registry.Render();
//
// Cost on the hot path: Increment / Set / Observe are lock-free (relaxed atomics). WithLabels
// takes the family's mutex and looks the series up: call it once per call or per stream and keep
// the pointer, not once per index.
//
// Thread-safety: every method of every class here is safe to call concurrently, Render included.
// A Render concurrent with updates sees each value atomically, but not all values at one instant
// (as every Prometheus client library). A histogram's _count is the sum of its buckets, so it
// always equals its +Inf bucket.
//
// Names are programmer input, not client input: an invalid metric or label name, a duplicate
// family name, or a wrong number of label values CHECK-fails. Label values are arbitrary UTF-8
// (escaped when rendered).
#ifndef SAMPLERD_SERVER_METRICS_REGISTRY_H_
#define SAMPLERD_SERVER_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace samplerd {
namespace metrics {

// A value that only goes up (Prometheus `counter`; name it `*_total`).
class Counter {
 public:
  // `amount` must be >= 0 (a negative amount is a programmer error: DCHECK).
  void Increment(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (Prometheus `gauge`).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in fixed buckets (Prometheus `histogram`; name it by its unit, e.g.
// `*_seconds`). Bucket i counts observations <= bounds[i]; one more bucket (+Inf) counts the rest.
class Histogram {
 public:
  // `bounds`: finite and strictly increasing (CHECK).
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds().size() + 1 of them (the last is +Inf's).
  std::vector<uint64_t> BucketCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// `count` bounds start, start * factor, start * factor^2, ... (start > 0, factor > 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Bounds for latencies and durations, in seconds: 0.5 ms to 5 min.
const std::vector<double>& DurationBuckets();

// The sample of a gauge computed at scrape time: label values in the family's label order.
struct GaugeSample {
  std::vector<std::string> label_values;
  double value = 0;
};

namespace internal {

// What the Registry renders: one family of one type.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;

  const std::string& name() const { return name_; }
  // Appends the family's `# HELP`, `# TYPE` and sample lines; nothing if it has no series.
  void Render(std::string* out) const;

 protected:
  // One sample line per series, in label-value order.
  virtual void RenderSamples(std::string* out) const = 0;
  virtual const char* type() const = 0;
  // `name{l1="v1",...,extra} value\n`; `extra` is a pre-rendered label (the histogram's le).
  void AppendSample(std::string* out, absl::string_view suffix,
                    const std::vector<std::string>& label_values, absl::string_view extra,
                    double value) const;
  size_t label_count() const { return label_names_.size(); }

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
};

}  // namespace internal

// The series of one metric by label values. T is Counter, Gauge or Histogram.
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  // The series with these label values (as many as the family has label names: CHECK), created
  // at 0 on first use. The pointer stays valid after Remove (updates to it are then no longer
  // rendered), so a call may keep it for its whole life.
  std::shared_ptr<T> WithLabels(const std::vector<std::string>& label_values)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops rendering the series (e.g. of a deleted job). No-op if absent.
  void Remove(const std::vector<std::string>& label_values) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::function<std::shared_ptr<T>()> make);

  void RenderSamples(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);
  const char* type() const override;

  const std::function<std::shared_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  // Ordered: the exposition is deterministic (tests compare it exactly).
  std::map<std::vector<std::string>, std::shared_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The process's registry, for instruments of modules that no single server owns (the
  // planner, the persistence layer). Never destroyed.
  static Registry& Default();

  // Add a family. The pointer lives as long as the registry. A family without labels has its
  // one series from the start (rendered as 0 before the first update).
  Family<Counter>* AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names = {}) ABSL_LOCKS_EXCLUDED(mu_);
  Family<Gauge>* AddGauge(std::string name, std::string help,
                          std::vector<std::string> label_names = {}) ABSL_LOCKS_EXCLUDED(mu_);
  Family<Histogram>* AddHistogram(std::string name, std::string help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> bounds = DurationBuckets())
      ABSL_LOCKS_EXCLUDED(mu_);
  // A gauge family whose samples `collect` returns at each Render (e.g. per-job state read from
  // the job registry, so that the jobs need no instrumentation). `collect` runs on the
  // rendering thread, with no lock of the registry held; it must be thread-safe and must
  // outlive the registry's last Render.
  void AddGaugeCallback(std::string name, std::string help, std::vector<std::string> label_names,
                        std::function<std::vector<GaugeSample>()> collect) ABSL_LOCKS_EXCLUDED(mu_);

  // Every family in the text format 0.0.4, ordered by name.
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  template <typename F>
  F* Add(std::unique_ptr<F> family) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<internal::FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// The Content-Type of Registry::Render's text.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace metrics
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_METRICS_REGISTRY_H_
