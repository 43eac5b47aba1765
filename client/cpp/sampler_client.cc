#include "client/cpp/sampler_client.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/retry_signal.h"
#include "proto/status_util.h"

namespace samplerd {
namespace {

// Writes `values` as chunks of at most `chunk_size` to an upload stream, then finishes it.
// `add(chunk, value)` appends one value to a chunk (weights or labels).
template <typename Chunk, typename T, typename AddFn>
grpc::Status WriteChunks(grpc::ClientWriter<Chunk>* writer, const std::string& job,
                         absl::Span<const T> values, size_t chunk_size, AddFn add) {
  for (size_t offset = 0; offset < values.size(); offset += chunk_size) {
    Chunk chunk;
    chunk.set_job(job);
    chunk.set_offset(offset);
    const size_t end = std::min(values.size(), offset + chunk_size);
    for (size_t i = offset; i < end; ++i) add(&chunk, values[i]);
    if (!writer->Write(chunk)) break;  // The server ended the stream; Finish() says why.
  }
  writer->WritesDone();
  return writer->Finish();
}

// The server must have counted every value or batch sent: a call that ends OK with fewer would
// otherwise lose them silently (e.g. a server that stops reading at a bad message and ends OK).
absl::Status CheckCount(const char* what, uint64_t counted, uint64_t sent) {
  if (counted == sent) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("the server acknowledged ", counted, " ", what, " but the client sent ", sent));
}

// `*field` (named `name`), or the environment variable `env` when it is empty.
void DefaultFromEnvironment(std::string* field, const char* env) {
  if (!field->empty()) return;
  if (const char* value = std::getenv(env); value != nullptr) *field = value;
}

// The PEM contents of the file at `path`, named `field` in errors.
absl::StatusOr<std::string> ReadPem(const char* field, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = \"", path, "\": cannot open it: ", std::strerror(errno)));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!absl::StrContains(data, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = \"", path, "\": not PEM (no '-----BEGIN ' line)"));
  }
  return data;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options) {
  if (options.client_cert.empty() != options.client_key.empty()) {
    return absl::InvalidArgumentError(
        options.client_key.empty()
            ? absl::StrCat("client_cert = \"", options.client_cert, "\" without client_key")
            : absl::StrCat("client_key = \"", options.client_key, "\" without client_cert"));
  }
  if (!options.tls && options.root_certificates.empty() && options.client_cert.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.root_certificates.empty()) {
    absl::StatusOr<std::string> roots = ReadPem("root_certificates", options.root_certificates);
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
  }
  if (!options.client_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("client_cert", options.client_cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("client_key", options.client_key);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

// The checks and environment defaults shared by Create and CreateWithChannel.
absl::Status CompleteOptions(ClientOptions* options) {
  if (options->max_retries < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_retries = ", options->max_retries, ": must be >= 0"));
  }
  if (options->retry_budget < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retry_budget = ", absl::FormatDuration(options->retry_budget), ": must be >= 0"));
  }
  for (const auto& [field, value] : {std::pair{"keepalive_time", options->keepalive_time},
                                     std::pair{"keepalive_timeout", options->keepalive_timeout}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = ", absl::FormatDuration(value), ": must be > 0"));
    }
  }
  DefaultFromEnvironment(&options->root_certificates, "SAMPLERD_CA");
  DefaultFromEnvironment(&options->client_cert, "SAMPLERD_CLIENT_CERT");
  DefaultFromEnvironment(&options->client_key, "SAMPLERD_CLIENT_KEY");
  DefaultFromEnvironment(&options->token, "SAMPLERD_TOKEN");
  for (char c : options->token) {
    if (c < 0x21 || c > 0x7e) {  // Never echo the token itself.
      return absl::InvalidArgumentError(
          "token: must be printable ASCII without spaces (as in --auth_tokens_file)");
    }
  }
  return absl::OkStatus();
}

// The retries of one call: a backoff doubling from initial_backoff to max_backoff, for at most
// max_retries retries and as long as the next one starts within retry_budget of the first
// failure. A shard stream restarts it whenever a chunk arrives.
class RetrySchedule {
 public:
  explicit RetrySchedule(const ClientOptions& options) : options_(options) { Restart(); }

  void Restart() {
    retries_ = 0;
    backoff_ = options_.initial_backoff;
    first_failure_ = absl::InfiniteFuture();
  }

  // After a retryable failure: the backoff before the next attempt, or nullopt when the
  // retries are spent.
  std::optional<absl::Duration> Next() {
    const absl::Time now = absl::Now();
    if (first_failure_ == absl::InfiniteFuture()) first_failure_ = now;
    if (retries_ >= options_.max_retries ||
        now + backoff_ - first_failure_ > options_.retry_budget) {
      return std::nullopt;
    }
    ++retries_;
    const absl::Duration backoff = backoff_;
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    return backoff;
  }

  // How the call retried, for its error message: "" if it did not.
  std::string Summary() const {
    if (retries_ == 0) return "";
    return absl::StrCat(
        " (gave up after ", retries_, retries_ == 1 ? " retry" : " retries", " in ",
        absl::FormatDuration(absl::Trunc(absl::Now() - first_failure_, absl::Milliseconds(100))),
        "; ClientOptions::retry_budget = ", absl::FormatDuration(options_.retry_budget), ")");
  }

 private:
  const ClientOptions& options_;
  int retries_ = 0;
  absl::Duration backoff_;
  absl::Time first_failure_;
};

// Whether a failed call may be sent again: UNAVAILABLE, or CANCELLED (this client cancels no
// call itself but a shard stream through StreamCancellation, checked before: so it comes from
// a server shutting down gracefully that had not finished the call when its drain ended).
// Every call is as safe to send again as after UNAVAILABLE (a lost acknowledgement).
bool Retryable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::CANCELLED;
}

// Whether a failed shard stream may be opened again, and if so the least delay before it
// (nullopt: not again). Retryable; or RESOURCE_EXHAUSTED for memory that frees itself as other
// streams end:
//   - the server's stream buffer budget, by its machine-readable signal (the trailer
//     samplerd-retry-after-ms, proto/retry_signal.h): at least its delay;
//   - gRPC's transport quota resetting the stream (RST_STREAM ENHANCE_YOUR_CALM, "Received
//     RST_STREAM with error code 11"): made by gRPC's transport, where no samplerd code runs
//     and no trailer is sent, so it is recognised by its message.
// Not the client's own receive limit ("larger than max") nor a chunk beyond the whole budget
// (no signal): the same request would be refused again.
std::optional<absl::Duration> ShardStreamRetryDelay(const grpc::Status& status,
                                                    const grpc::ClientContext& context) {
  if (Retryable(status)) return absl::ZeroDuration();
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return std::nullopt;
  if (std::optional<absl::Duration> after =
          RetryAfterFromTrailers(context.GetServerTrailingMetadata())) {
    return after;
  }
  if (absl::StrContains(status.error_message(), "RST_STREAM")) return absl::ZeroDuration();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SamplerClient>> SamplerClient::Create(const std::string& address,
                                                                     ClientOptions options) {
  if (address.empty()) return absl::InvalidArgumentError("address = \"\": expected host:port");
  if (absl::Status s = CompleteOptions(&options); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(options);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  // The channel's own reconnection backoff follows ours: by default it grows to 120 s, and a
  // channel waiting out its backoff fails every call at once, so a server back after a restart
  // would only be seen after our retries had all been spent.
  const auto ms = [](absl::Duration d) {
    return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
  };
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(options.initial_backoff));
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is also the timeout of one connection attempt (default
  // 20 s): an attempt made while a killed server's port is being taken over can hang that long,
  // so a second is allowed (a handshake with a busy, recovering server can take more than
  // initial_backoff, which once was the value here).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(1000, ms(options.max_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(options.max_backoff));
  // Keepalive (ClientOptions::keepalive_time): pings also while no call is in flight and while
  // a stream waits without data (gRPC's default stops after two pings without data), so that a
  // flow lost without a reset is noticed and redialled within keepalive_time + timeout.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ms(options.keepalive_time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(options.keepalive_timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A name (a headless Kubernetes Service) is resolved again at most this often while the
  // channel reconnects (default 30 s): a samplerd rescheduled on another node, with another
  // address, is found at the next retry rather than up to 30 s later.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, ms(options.max_backoff));
  auto channel = grpc::CreateCustomChannel(address, *credentials, args);
  return std::unique_ptr<SamplerClient>(new SamplerClient(std::move(channel), options));
}

absl::StatusOr<std::unique_ptr<SamplerClient>> SamplerClient::CreateWithChannel(
    std::shared_ptr<grpc::Channel> channel, ClientOptions options) {
  if (channel == nullptr) return absl::InvalidArgumentError("channel: null");
  if (absl::Status s = CompleteOptions(&options); !s.ok()) return s;
  return std::unique_ptr<SamplerClient>(new SamplerClient(std::move(channel), options));
}

SamplerClient::SamplerClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)), stub_(v1::Sampler::NewStub(channel_)), options_(options) {}

void SamplerClient::PrepareContext(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  // Metadata rather than gRPC's call credentials, which plaintext channels refuse (a token on
  // a loopback plaintext server is a legitimate setup).
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
}

absl::Status SamplerClient::WithRetries(
    const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  return Retry([&](uint64_t) {
    grpc::ClientContext context;
    PrepareContext(&context);
    return call(&context);
  });
}

absl::Status SamplerClient::Retry(const std::function<grpc::Status(uint64_t incarnation)>& attempt,
                                  ClaimSource* claim) {
  RetrySchedule retries(options_);
  for (;;) {
    uint64_t incarnation = 0;
    if (claim != nullptr) {
      absl::StatusOr<uint64_t> claimed = claim->Incarnation();
      if (!claimed.ok()) return claimed.status();
      incarnation = *claimed;
    }
    grpc::Status status = attempt(incarnation);
    const bool aborted = claim != nullptr && status.error_code() == grpc::StatusCode::ABORTED;
    if (!Retryable(status) && !aborted) return FromGrpcStatus(status);
    if (aborted) claim->Renew(incarnation);
    std::optional<absl::Duration> backoff = retries.Next();
    if (!backoff.has_value()) {
      absl::Status error = FromGrpcStatus(status);
      return absl::Status(error.code(), absl::StrCat(error.message(), retries.Summary()));
    }
    BackOff(*backoff, /*cancellation=*/nullptr);
  }
}

bool SamplerClient::BackOff(absl::Duration backoff, StreamCancellation* cancellation) const {
  // Short enough slices that a cancellation ends the wait promptly.
  constexpr absl::Duration kSlice = absl::Milliseconds(20);
  const absl::Time end = absl::Now() + backoff;
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    if (cancellation != nullptr && cancellation->cancelled()) return true;
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) {  // Nothing to drive: wait out the rest.
      if (cancellation != nullptr) return cancellation->SleepUnlessCancelled(end - now);
      absl::SleepFor(end - now);
      return false;
    }
    // Polls gRPC (and so the connection attempt) until the state changes or the slice ends.
    channel_->WaitForStateChange(state, absl::ToChronoTime(std::min(end, now + kSlice)));
  }
  return cancellation != nullptr && cancellation->cancelled();
}

absl::StatusOr<v1::Job> SamplerClient::CreateJob(const std::string& name, const v1::JobSpec& spec) {
  v1::CreateJobRequest request;
  request.set_name(name);
  *request.mutable_spec() = spec;
  v1::Job job;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->CreateJob(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> SamplerClient::GetJob(const std::string& name) {
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->GetJob(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> SamplerClient::GetJob(const std::string& name, uint32_t rank,
                                              std::optional<uint64_t> epoch) {
  v1::GetJobRequest request;
  request.set_name(name);
  request.set_rank(rank);
  if (epoch.has_value()) request.set_epoch(*epoch);
  v1::Job job;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->GetJob(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<std::vector<v1::Job>> SamplerClient::ListJobs() {
  v1::ListJobsResponse response;
  absl::Status s = WithRetries(
      [&](grpc::ClientContext* c) { return stub_->ListJobs(c, v1::ListJobsRequest(), &response); });
  if (!s.ok()) return s;
  return std::vector<v1::Job>(response.jobs().begin(), response.jobs().end());
}

absl::Status SamplerClient::DeleteJob(const std::string& name) {
  v1::DeleteJobRequest request;
  request.set_name(name);
  v1::DeleteJobResponse response;
  return WithRetries(
      [&](grpc::ClientContext* c) { return stub_->DeleteJob(c, request, &response); });
}

absl::StatusOr<v1::Job> SamplerClient::ResizeJob(const std::string& name, uint64_t epoch,
                                                 uint32_t world_size) {
  v1::ResizeJobRequest request;
  request.set_name(name);
  request.set_epoch(epoch);
  request.set_world_size(world_size);
  v1::Job job;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->ResizeJob(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> SamplerClient::RewindJob(const std::string& name, uint64_t epoch) {
  v1::RewindJobRequest request;
  request.set_name(name);
  request.set_epoch(epoch);
  v1::Job job;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->RewindJob(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> SamplerClient::SetGroupWeights(const std::string& job,
                                                       absl::Span<const double> weights) {
  v1::SetGroupWeightsRequest request;
  request.set_job(job);
  request.mutable_group_weights()->Add(weights.begin(), weights.end());
  v1::Job out;
  absl::Status s = WithRetries(
      [&](grpc::ClientContext* c) { return stub_->SetGroupWeights(c, request, &out); });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<v1::JobStatus> SamplerClient::GetJobStatus(const std::string& name,
                                                          bool weight_history) {
  v1::GetJobStatusRequest request;
  request.set_name(name);
  request.set_weight_history(weight_history);
  v1::JobStatus status;
  absl::Status s =
      WithRetries([&](grpc::ClientContext* c) { return stub_->GetJobStatus(c, request, &status); });
  if (!s.ok()) return s;
  return status;
}

absl::StatusOr<v1::EndEpochResponse> SamplerClient::EndEpoch(const std::string& job, uint64_t epoch,
                                                             uint32_t rank, uint32_t deal,
                                                             ClaimSource* claim) {
  v1::EndEpochRequest request;
  request.set_job(job);
  request.set_epoch(epoch);
  request.set_rank(rank);
  request.set_deal(deal);
  v1::EndEpochResponse response;
  absl::Status s = Retry(
      [&](uint64_t incarnation) {
        request.set_incarnation(incarnation);
        grpc::ClientContext context;
        PrepareContext(&context);
        return stub_->EndEpoch(&context, request, &response);
      },
      claim);
  if (!s.ok()) return s;
  return response;
}

absl::Status SamplerClient::UploadWeights(const std::string& job, absl::Span<const float> weights,
                                          size_t chunk_size) {
  if (chunk_size == 0) return absl::InvalidArgumentError("chunk_size = 0: must be >= 1");
  v1::UploadSummary summary;
  absl::Status s = WithRetries([&](grpc::ClientContext* c) {
    summary.Clear();
    auto writer = stub_->UploadWeights(c, &summary);
    return WriteChunks<v1::UploadWeightsChunk, float>(
        writer.get(), job, weights, chunk_size,
        [](v1::UploadWeightsChunk* chunk, float w) { chunk->add_weights(w); });
  });
  if (!s.ok()) return s;
  return CheckCount("weights", summary.received(), weights.size());
}

absl::Status SamplerClient::UploadLabels(const std::string& job, absl::Span<const uint32_t> labels,
                                         size_t chunk_size) {
  if (chunk_size == 0) return absl::InvalidArgumentError("chunk_size = 0: must be >= 1");
  v1::UploadSummary summary;
  absl::Status s = WithRetries([&](grpc::ClientContext* c) {
    summary.Clear();
    auto writer = stub_->UploadLabels(c, &summary);
    return WriteChunks<v1::UploadLabelsChunk, uint32_t>(
        writer.get(), job, labels, chunk_size,
        [](v1::UploadLabelsChunk* chunk, uint32_t label) { chunk->add_labels(label); });
  });
  if (!s.ok()) return s;
  return CheckCount("labels", summary.received(), labels.size());
}

void StreamCancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

bool StreamCancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool StreamCancellation::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  context_ = context;
  return true;
}

void StreamCancellation::Detach() {
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
}

bool StreamCancellation::SleepUnlessCancelled(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), duration);
  return cancelled_;
}

absl::Status SamplerClient::StreamShard(
    const std::string& job, uint64_t epoch, uint32_t rank, uint32_t world_size,
    uint64_t start_offset, bool with_is_weights,
    const std::function<absl::Status(const ShardSlice&)>& on_slice) {
  StreamShardOptions options;
  options.start_offset = start_offset;
  options.with_is_weights = with_is_weights;
  return StreamShard(job, epoch, rank, world_size, options, on_slice);
}

absl::Status SamplerClient::StreamShard(
    const std::string& job, uint64_t epoch, uint32_t rank, uint32_t world_size,
    const StreamShardOptions& stream_options,
    const std::function<absl::Status(const ShardSlice&)>& on_slice) {
  StreamCancellation* const cancellation = stream_options.cancellation;
  const absl::Status cancelled = absl::CancelledError("the shard stream was cancelled");
  uint64_t next = stream_options.start_offset;  // First shard position not yet delivered.
  ClaimSource* const claim = stream_options.claim;
  RetrySchedule retries(options_);
  // The stream's error, naming the shard and where it stopped.
  const auto failed = [&](absl::StatusCode code, absl::string_view message) {
    return ShardStreamError(absl::Status(code, absl::StrCat(message, retries.Summary())), job,
                            epoch, rank, world_size, next);
  };
  std::vector<uint64_t> widened;  // indices32 widened to 64 bits for the callback.
  for (;;) {
    v1::StreamShardRequest request;
    request.set_job(job);
    request.set_epoch(epoch);
    request.set_rank(rank);
    request.set_world_size(world_size);
    request.set_start_offset(next);
    request.set_deal(stream_options.deal);
    request.set_with_is_weights(stream_options.with_is_weights);
    request.set_with_irreducible_losses(stream_options.with_irreducible_losses);
    request.set_max_chunk_size(stream_options.max_chunk_size);
    request.set_observe(stream_options.observe);
    if (claim != nullptr) {
      absl::StatusOr<uint64_t> incarnation = claim->Incarnation();
      if (!incarnation.ok()) {
        return failed(incarnation.status().code(),
                      absl::StrCat("claiming the rank: ", incarnation.status().message()));
      }
      request.set_incarnation(*incarnation);
    }
    grpc::ClientContext context;
    PrepareContext(&context);
    if (cancellation != nullptr && !cancellation->Attach(&context)) return cancelled;
    // Detached on every way out of this attempt, before `context` is destroyed.
    struct Detacher {
      StreamCancellation* c;
      ~Detacher() {
        if (c != nullptr) c->Detach();
      }
    } detacher{cancellation};
    std::unique_ptr<grpc::ClientReader<v1::ShardChunk>> reader =
        stub_->StreamShard(&context, request);
    v1::ShardChunk chunk;
    bool finished = false;
    absl::Status callback_status;
    while (reader->Read(&chunk)) {
      if (chunk.offset() != next) {
        context.TryCancel();
        reader->Finish();
        return failed(absl::StatusCode::kInternal,
                      absl::StrCat("shard chunk offset = ", chunk.offset(), ": expected ", next));
      }
      ShardSlice slice;
      slice.offset = chunk.offset();
      slice.shard_length = chunk.shard_length();
      if (chunk.indices64_size() > 0) {
        slice.indices = absl::MakeConstSpan(chunk.indices64().data(), chunk.indices64_size());
      } else {
        widened.assign(chunk.indices32().begin(), chunk.indices32().end());
        slice.indices = absl::MakeConstSpan(widened);
      }
      slice.is_weights = absl::MakeConstSpan(chunk.is_weights().data(), chunk.is_weights_size());
      slice.irreducible_losses =
          absl::MakeConstSpan(chunk.irreducible_losses().data(), chunk.irreducible_losses_size());
      callback_status = on_slice(slice);
      if (!callback_status.ok()) {
        context.TryCancel();
        reader->Finish();
        return callback_status;
      }
      next += slice.indices.size();
      finished = chunk.last();
      retries.Restart();  // Progress: the retries count from here.
    }
    grpc::Status status = reader->Finish();
    if (status.ok() || finished) return absl::OkStatus();
    if (cancellation != nullptr && cancellation->cancelled()) return cancelled;
    std::optional<absl::Duration> backoff;
    const bool aborted = claim != nullptr && status.error_code() == grpc::StatusCode::ABORTED;
    if (aborted) claim->Renew(request.incarnation());
    const std::optional<absl::Duration> at_least = ShardStreamRetryDelay(status, context);
    if (at_least.has_value() || aborted) backoff = retries.Next();
    if (backoff.has_value() && at_least.has_value()) backoff = std::max(*backoff, *at_least);
    if (!backoff.has_value()) {
      const absl::Status error = FromGrpcStatus(status);
      return failed(error.code(), error.message());
    }
    if (BackOff(*backoff, cancellation)) return cancelled;
  }
}

absl::StatusOr<std::vector<uint64_t>> SamplerClient::ReadShard(const std::string& job,
                                                               uint64_t epoch, uint32_t rank,
                                                               uint32_t world_size) {
  std::vector<uint64_t> shard;
  absl::Status s =
      StreamShard(job, epoch, rank, world_size, /*start_offset=*/0,
                  /*with_is_weights=*/false, [&](const ShardSlice& slice) {
                    if (shard.empty()) shard.reserve(slice.shard_length);
                    shard.insert(shard.end(), slice.indices.begin(), slice.indices.end());
                    return absl::OkStatus();
                  });
  if (!s.ok()) return s;
  return shard;
}

absl::StatusOr<v1::LossReportSummary> SamplerClient::ReportLosses(
    absl::Span<const v1::LossBatch> batches) {
  return SendLosses(
      batches.size(), [&](size_t k, uint64_t) -> const v1::LossBatch& { return batches[k]; },
      nullptr);
}

absl::StatusOr<v1::LossReportSummary> SamplerClient::ReportLosses(absl::Span<v1::LossBatch> batches,
                                                                  ClaimSource* claim) {
  return SendLosses(
      batches.size(),
      [&](size_t k, uint64_t incarnation) -> const v1::LossBatch& {
        batches[k].set_incarnation(incarnation);
        return batches[k];
      },
      claim);
}

absl::StatusOr<v1::LossReportSummary> SamplerClient::SendLosses(
    size_t count, const std::function<const v1::LossBatch&(size_t, uint64_t)>& batch,
    ClaimSource* claim) {
  v1::LossReportSummary summary;
  // Retrying the whole stream is safe: the server counts positions it already applied as
  // duplicates.
  absl::Status s = Retry(
      [&](uint64_t incarnation) {
        summary.Clear();
        grpc::ClientContext context;
        PrepareContext(&context);
        std::unique_ptr<grpc::ClientWriter<v1::LossBatch>> writer =
            stub_->ReportLosses(&context, &summary);
        for (size_t k = 0; k < count; ++k) {
          if (!writer->Write(batch(k, incarnation))) break;
        }
        writer->WritesDone();
        return writer->Finish();
      },
      claim);
  if (!s.ok()) return s;
  if (absl::Status counted = CheckCount("loss batches", summary.batches(), count); !counted.ok()) {
    return counted;
  }
  return summary;
}

absl::Status ShardStreamError(const absl::Status& error, absl::string_view job, uint64_t epoch,
                              uint32_t rank, uint32_t world_size, uint64_t position) {
  return absl::Status(
      error.code(),
      absl::StrCat("job \"", job, "\" epoch ", epoch, " rank ", rank, " of ", world_size,
                   ": shard stream failed at position ", position, ": ", error.message()));
}

}  // namespace samplerd
