#include "server/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace samplerd {
namespace metrics {
namespace {

// Prometheus data model: metric names [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
// (names starting with "__" are reserved).
bool ValidName(absl::string_view name, bool colons) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  return std::all_of(name.begin(), name.end(), [colons](char c) {
    return absl::ascii_isalnum(c) || c == '_' || (colons && c == ':');
  });
}

// Adds `amount` to an atomic double (no fetch_add for floating point before C++20).
void AtomicAdd(std::atomic<double>* value, double amount) {
  double old = value->load(std::memory_order_relaxed);
  while (!value->compare_exchange_weak(old, old + amount, std::memory_order_relaxed)) {
  }
}

// Exact integers in full; other values in the shortest text that reads back as the same double
// (0.1 is "0.1"); Prometheus's spellings of the non-finite values.
void AppendValue(std::string* out, double value) {
  if (std::isnan(value)) {
    out->append("NaN");
  } else if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
  } else if (value == std::trunc(value) && std::abs(value) < 0x1p53) {
    // Integers in full ("100000", not the shorter "1e+05"): counts read as counts.
    absl::StrAppend(out, static_cast<int64_t>(value));
  } else {
    // Positional notation where Go's strconv (Prometheus's own formatting) uses it: "0.0005"
    // as a histogram bound, not "5e-04".
    const double magnitude = std::abs(value);
    const auto format = magnitude >= 1e-4 && magnitude < 1e21 ? std::chars_format::fixed
                                                              : std::chars_format::general;
    char buffer[64];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, format);
    out->append(buffer, result.ptr);
  }
}

// Label values: backslash, double quote and line feed are escaped. # HELP text: backslash and
// line feed (the format's two escaping rules).
void AppendEscaped(std::string* out, absl::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && quote) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

class CallbackGaugeFamily final : public internal::FamilyBase {
 public:
  CallbackGaugeFamily(std::string name, std::string help, std::vector<std::string> label_names,
                      std::function<std::vector<GaugeSample>()> collect)
      : FamilyBase(std::move(name), std::move(help), std::move(label_names)),
        collect_(std::move(collect)) {}

 private:
  void RenderSamples(std::string* out) const override {
    std::vector<GaugeSample> samples = collect_();
    std::sort(samples.begin(), samples.end(), [](const GaugeSample& a, const GaugeSample& b) {
      return a.label_values < b.label_values;
    });
    for (const GaugeSample& sample : samples) {
      CHECK_EQ(sample.label_values.size(), label_count()) << name();
      AppendSample(out, "", sample.label_values, "", sample.value);
    }
  }
  const char* type() const override { return "gauge"; }

  const std::function<std::vector<GaugeSample>()> collect_;
};

}  // namespace

// ---- Instruments --------------------------------------------------------------------------------

void Counter::Increment(double amount) {
  DCHECK_GE(amount, 0) << "a counter only goes up";
  AtomicAdd(&value_, amount);
}

void Gauge::Add(double amount) { AtomicAdd(&value_, amount); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    CHECK(std::isfinite(bounds_[i])) << "histogram bound " << bounds_[i];
    CHECK(i == 0 || bounds_[i - 1] < bounds_[i]) << "histogram bounds must increase";
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // The first bound >= value: bucket `le` counts observations <= le. NaN lands in +Inf.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = counts_[i].load(std::memory_order_relaxed);
  return counts;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  CHECK_GT(start, 0);
  CHECK_GT(factor, 1);
  std::vector<double> bounds;
  for (double b = start; static_cast<int>(bounds.size()) < count; b *= factor) bounds.push_back(b);
  return bounds;
}

const std::vector<double>& DurationBuckets() {
  // Loss reports take well under a millisecond, planning a 1e9-sample epoch tens of seconds, a
  // shard stream the whole epoch.
  static const auto* const bounds = new std::vector<double>{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  return *bounds;
}

// ---- Families -----------------------------------------------------------------------------------

namespace internal {

FamilyBase::FamilyBase(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {
  CHECK(ValidName(name_, /*colons=*/true)) << "invalid metric name '" << name_ << "'";
  for (const std::string& label : label_names_) {
    CHECK(ValidName(label, /*colons=*/false) && label.rfind("__", 0) != 0 && label != "le")
        << "invalid label name '" << label << "' of " << name_;
  }
}

void FamilyBase::Render(std::string* out) const {
  std::string samples;
  RenderSamples(&samples);
  if (samples.empty()) return;
  absl::StrAppend(out, "# HELP ", name_, " ");
  AppendEscaped(out, help_, /*quote=*/false);
  absl::StrAppend(out, "\n# TYPE ", name_, " ", type(), "\n", samples);
}

void FamilyBase::AppendSample(std::string* out, absl::string_view suffix,
                              const std::vector<std::string>& label_values, absl::string_view extra,
                              double value) const {
  absl::StrAppend(out, name_, suffix);
  if (!label_values.empty() || !extra.empty()) {
    out->push_back('{');
    for (size_t i = 0; i < label_values.size(); ++i) {
      absl::StrAppend(out, i == 0 ? "" : ",", label_names_[i], "=\"");
      AppendEscaped(out, label_values[i], /*quote=*/true);
      out->push_back('"');
    }
    absl::StrAppend(out, label_values.empty() || extra.empty() ? "" : ",", extra, "}");
  }
  out->push_back(' ');
  AppendValue(out, value);
  out->push_back('\n');
}

}  // namespace internal

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<std::string> label_names,
                  std::function<std::shared_ptr<T>()> make)
    : FamilyBase(std::move(name), std::move(help), std::move(label_names)), make_(std::move(make)) {
  if (label_count() == 0) WithLabels({});
}

template <typename T>
std::shared_ptr<T> Family<T>::WithLabels(const std::vector<std::string>& label_values) {
  CHECK_EQ(label_values.size(), label_count()) << "label values of " << name();
  absl::MutexLock lock(&mu_);
  std::shared_ptr<T>& series = series_[label_values];
  if (series == nullptr) series = make_();
  return series;
}

template <typename T>
void Family<T>::Remove(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  series_.erase(label_values);
}

template <>
const char* Family<Counter>::type() const {
  return "counter";
}
template <>
const char* Family<Gauge>::type() const {
  return "gauge";
}
template <>
const char* Family<Histogram>::type() const {
  return "histogram";
}

template <typename T>
void Family<T>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, series] : series_) AppendSample(out, "", labels, "", series->value());
}

template <>
void Family<Histogram>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, histogram] : series_) {
    const std::vector<uint64_t> counts = histogram->BucketCounts();
    uint64_t cumulative = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      cumulative += counts[i];
      std::string le = "le=\"";
      if (i < histogram->bounds().size()) {
        AppendValue(&le, histogram->bounds()[i]);
      } else {
        le.append("+Inf");
      }
      le.push_back('"');
      AppendSample(out, "_bucket", labels, le, static_cast<double>(cumulative));
    }
    AppendSample(out, "_sum", labels, "", histogram->sum());
    AppendSample(out, "_count", labels, "", static_cast<double>(cumulative));
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Registry -----------------------------------------------------------------------------------

Registry& Registry::Default() {
  static Registry* const registry = new Registry();
  return *registry;
}

template <typename F>
F* Registry::Add(std::unique_ptr<F> family) {
  F* const raw = family.get();
  absl::MutexLock lock(&mu_);
  const bool added = families_.emplace(family->name(), std::move(family)).second;
  CHECK(added) << "metric " << raw->name() << " registered twice";
  return raw;
}

Family<Counter>* Registry::AddCounter(std::string name, std::string help,
                                      std::vector<std::string> label_names) {
  return Add(std::unique_ptr<Family<Counter>>(
      new Family<Counter>(std::move(name), std::move(help), std::move(label_names),
                          [] { return std::make_shared<Counter>(); })));
}

Family<Gauge>* Registry::AddGauge(std::string name, std::string help,
                                  std::vector<std::string> label_names) {
  return Add(std::unique_ptr<Family<Gauge>>(
      new Family<Gauge>(std::move(name), std::move(help), std::move(label_names),
                        [] { return std::make_shared<Gauge>(); })));
}

Family<Histogram>* Registry::AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  // Checked here, not at the first series: a bad bound is a bug of the registration.
  Histogram check(bounds);
  return Add(std::unique_ptr<Family<Histogram>>(new Family<Histogram>(
      std::move(name), std::move(help), std::move(label_names),
      [bounds = std::move(bounds)] { return std::make_shared<Histogram>(bounds); })));
}

void Registry::AddGaugeCallback(std::string name, std::string help,
                                std::vector<std::string> label_names,
                                std::function<std::vector<GaugeSample>()> collect) {
  Add(std::make_unique<CallbackGaugeFamily>(std::move(name), std::move(help),
                                            std::move(label_names), std::move(collect)));
}

std::string Registry::Render() const {
  // Families are never removed: render them off the registry lock, so that a collector may take
  // its own locks (and a slow one does not stall registrations).
  std::vector<const internal::FamilyBase*> families;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, family] : families_) families.push_back(family.get());
  }
  std::string out;
  for (const internal::FamilyBase* family : families) family->Render(&out);
  return out;
}

}  // namespace metrics
}  // namespace samplerd
