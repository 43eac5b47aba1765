// SamplerClient: the C++ client of samplerd (proto/samplerd.proto), for C++ trainers and tools.
//
// A thin typed wrapper over the generated stub: every call has a deadline, UNAVAILABLE (and a
// CANCELLED the client did not cause) is retried with exponential backoff, and gRPC statuses
// come back as absl::Status with the server's message.
// Streaming a shard resumes transparently after a broken stream (StreamShard's start_offset), so a
// caller sees every index of its shard exactly once, in order.
//
// Every summary the server returns is checked against what was sent (uploads: values received;
// ReportLosses: batches counted), so a stream cut short can never pass for a complete one.
//
// Thread-safety: a SamplerClient is safe for concurrent use from many threads (the channel and
// stub are).
#ifndef SAMPLERD_CLIENT_CPP_SAMPLER_CLIENT_H_
#define SAMPLERD_CLIENT_CPP_SAMPLER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/samplerd.grpc.pb.h"
#include "proto/samplerd.pb.h"

namespace samplerd {

struct ClientOptions {
  // Deadline of each unary call and of each attempt to stream a shard.
  absl::Duration timeout = absl::Seconds(30);
  // How long a call is retried (UNAVAILABLE, CANCELLED, a broken shard stream) before its error
  // is returned: retries stop once the next backoff would end past retry_budget after the
  // first failure (for a shard stream: after the last chunk received). The default, 5 min,
  // covers a samplerd restarted by its supervisor (deploy/systemd: 5 s after a crash) or
  // rescheduled on another node with its volume (a Kubernetes StatefulSet pod: detach and attach
  // of the volume, image pull, recovery; docs/OPERATIONS.md "Losing samplerd's node"). A tool
  // that should fail fast sets less, or sets max_retries.
  absl::Duration retry_budget = absl::Milliseconds(v1::DEFAULT_RETRY_BUDGET_MS);
  // Most retries after the first attempt, >= 0 (for a shard stream: in a row without a chunk
  // received), within retry_budget. The default sets no limit but the budget. The client
  // cancels no call itself but a shard stream through StreamCancellation, so a CANCELLED comes
  // from a server shutting down (it cancels the calls it had not finished) and is retried.
  int max_retries = std::numeric_limits<int>::max();
  // First backoff; doubles each retry, capped at max_backoff.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // Keepalive: the client pings its connection every keepalive_time (also with no call in
  // flight) and, when a ping is not acknowledged within keepalive_timeout, drops the connection
  // -- a flow a NAT, load balancer or switch forgot without a reset -- so that its calls fail
  // with UNAVAILABLE and are retried on a new connection, a shard stream at its position. The
  // server accepts pings every --min_client_ping_interval_ms (5 s): keepalive_time must not be
  // shorter, or the server closes the connection (GOAWAY too_many_pings). Both > 0.
  absl::Duration keepalive_time = absl::Milliseconds(v1::CLIENT_KEEPALIVE_TIME_MS);
  absl::Duration keepalive_timeout = absl::Milliseconds(v1::CLIENT_KEEPALIVE_TIMEOUT_MS);
  // Largest message accepted from the server.
  int max_receive_message_bytes = 64 << 20;

  // Security (docs/SECURITY.md), the same settings as the Python client's. Each empty one is
  // taken from its environment variable, if set: SAMPLERD_CA, SAMPLERD_CLIENT_CERT,
  // SAMPLERD_CLIENT_KEY, SAMPLERD_TOKEN.
  //
  // TLS is used when `tls` is true or any of the three PEM files is set; plaintext otherwise.
  bool tls = false;
  // Path of the PEM file of the CA(s) that signed the server's certificate. Empty with TLS:
  // gRPC's default roots.
  std::string root_certificates;
  // Paths of the client's PEM certificate and private key, for a server that requires mutual
  // TLS (--tls_client_ca). Both or neither.
  std::string client_cert;
  std::string client_key;
  // Bearer token sent with every call as "authorization: Bearer <token>".
  std::string token;
};

// One shard chunk as delivered to a StreamShard callback.
struct ShardSlice {
  uint64_t offset = 0;                 // Shard position of indices[0].
  uint64_t shard_length = 0;           // Total length of the shard.
  absl::Span<const uint64_t> indices;  // Valid only during the callback.
  absl::Span<const float> is_weights;  // Empty unless requested.
  // The irreducible loss of each index as uploaded (a REDUCIBLE_LOSS job's); empty unless
  // requested (StreamShardOptions::with_irreducible_losses).
  absl::Span<const float> irreducible_losses;
};

// Stops a StreamShard call from another thread (a ShardReader opening another epoch, or being
// destroyed, while its stream waits for the server or sleeps between retries): the call returns
// CANCELLED promptly instead of at its deadline. Once cancelled, it stays cancelled; use one per
// call. Thread-safe.
class StreamCancellation {
 public:
  StreamCancellation() = default;
  StreamCancellation(const StreamCancellation&) = delete;
  StreamCancellation& operator=(const StreamCancellation&) = delete;

  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class SamplerClient;
  // StreamShard registers each attempt's context here while the attempt runs, so that Cancel()
  // can cancel it; false if already cancelled (then the attempt is not started).
  bool Attach(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps `duration` unless cancelled meanwhile; true if cancelled.
  bool SleepUnlessCancelled(absl::Duration duration) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// Where a rank's requests get their claim's incarnation (proto "Rank claims"): a RankClaim
// (client/cpp/rank_claim.h). The calls that take one (StreamShard, ReportLosses, EndEpoch) put
// Incarnation() in each attempt's request; an attempt the server answers ABORTED (a claim it no
// longer holds: a server restart) calls Renew and is retried, within the client's retries.
// Implementations are thread-safe.
class ClaimSource {
 public:
  virtual ~ClaimSource() = default;
  // The claim's incarnation, claiming the rank (again) if its call has ended; the refusal
  // (FAILED_PRECONDITION: another live process holds the rank) otherwise.
  virtual absl::StatusOr<uint64_t> Incarnation() = 0;
  // The server no longer holds `stale`: the next Incarnation claims again.
  virtual void Renew(uint64_t stale) = 0;
};

// How StreamShard streams, beyond (job, epoch, rank, world_size).
struct StreamShardOptions {
  // Shard position to start from.
  uint64_t start_offset = 0;
  // Also deliver each index's importance-sampling weight (ShardSlice::is_weights).
  bool with_is_weights = false;
  // Also deliver each index's irreducible loss (ShardSlice::irreducible_losses): RHO-LOSS's
  // selection in the trainer. FAILED_PRECONDITION naming the job unless it holds them.
  bool with_irreducible_losses = false;
  // Indices per chunk (StreamShardRequest.max_chunk_size): 0 for the server's default, at most
  // v1::MAX_SHARD_CHUNK_SIZE.
  uint32_t max_chunk_size = 0;
  // If set, Cancel() on it ends the call with CANCELLED. Must outlive the call.
  StreamCancellation* cancellation = nullptr;
  // The epoch's deal (v1::Job::deal; 0 unless the group was resized in the epoch).
  uint32_t deal = 0;
  // The rank's claim (must outlive the call), or null: then the stream is refused
  // (FAILED_PRECONDITION) while another process holds the rank, unless `observe`.
  ClaimSource* claim = nullptr;
  // The shard is read to be looked at, not trained (StreamShardRequest.observe): allowed
  // whoever holds the rank.
  bool observe = false;
};

// `error` with the shard stream it ended named: `job "j" epoch 3 rank 1 of 8: shard stream failed
// at position P: <error's message>`, the same code. SamplerClient::StreamShard's errors have this
// form; ShardReader gives its own ones the same.
absl::Status ShardStreamError(const absl::Status& error, absl::string_view job, uint64_t epoch,
                              uint32_t rank, uint32_t world_size, uint64_t position);

class SamplerClient {
 public:
  // Connects (lazily) to `address` ("host:port"), with TLS or plaintext as `options` say.
  // INVALID_ARGUMENT, naming the field and the path, for a PEM file that cannot be read or is
  // not PEM, or client_cert without client_key (or the reverse).
  static absl::StatusOr<std::unique_ptr<SamplerClient>> Create(const std::string& address,
                                                               ClientOptions options = {});

  // A client over a channel the caller made: one with gRPC client interceptors (tests inject
  // faults so), or an in-process one. The channel carries its own credentials: of `options`'
  // security fields only `token` is used (taken from SAMPLERD_TOKEN when empty, as in Create).
  // INVALID_ARGUMENT for a null channel or bad options, as Create.
  static absl::StatusOr<std::unique_ptr<SamplerClient>> CreateWithChannel(
      std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});

  absl::StatusOr<v1::Job> CreateJob(const std::string& name, const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> GetJob(const std::string& name);
  // The job with the length of rank `rank`'s shard (v1::Job::shard_length) in the current epoch's
  // deal, or in `epoch` if set (a later epoch: dealt whole to the current world size).
  // FAILED_PRECONDITION for an epoch before the current one (the server no longer says it).
  absl::StatusOr<v1::Job> GetJob(const std::string& name, uint32_t rank,
                                 std::optional<uint64_t> epoch = std::nullopt);
  absl::StatusOr<std::vector<v1::Job>> ListJobs();
  absl::Status DeleteJob(const std::string& name);
  // `weight_history`: a mixture job's status also lists the group weights in force at each
  // epoch (proto MixtureStatus.history).
  absl::StatusOr<v1::JobStatus> GetJobStatus(const std::string& name, bool weight_history = false);
  // `deal`: the epoch's deal the rank read (v1::Job::deal). `claim`: the rank's claim (see
  // ClaimSource), or null.
  absl::StatusOr<v1::EndEpochResponse> EndEpoch(const std::string& job, uint64_t epoch,
                                                uint32_t rank, uint32_t deal = 0,
                                                ClaimSource* claim = nullptr);
  // The group now has `world_size` ranks (proto ResizeJob; called once by the group's first
  // rank for the job's current epoch). Returns the job with its new world_size and deal.
  absl::StatusOr<v1::Job> ResizeJob(const std::string& name, uint64_t epoch, uint32_t world_size);
  // Puts the job back to the start of `epoch`, one of v1::Job::rewindable_epochs (proto
  // RewindJob; samplerctl rewind): called once, by one rank, before the ranks resume from
  // position 0 of that epoch. Returns the job as it is then.
  absl::StatusOr<v1::Job> RewindJob(const std::string& name, uint64_t epoch);
  // A mixture job with static weights: `weights` (one per group) in force from the returned
  // job's current_epoch + 1 (proto SetGroupWeights; samplerctl weights).
  absl::StatusOr<v1::Job> SetGroupWeights(const std::string& job, absl::Span<const double> weights);

  // Uploads N static weights (or labels) in chunks of `chunk_size`. DATA_LOSS if the server
  // acknowledges another count of values than was sent.
  absl::Status UploadWeights(const std::string& job, absl::Span<const float> weights,
                             size_t chunk_size = 1 << 18);
  absl::Status UploadLabels(const std::string& job, absl::Span<const uint32_t> labels,
                            size_t chunk_size = 1 << 18);

  // Streams rank `rank`'s shard of `epoch` from `start_offset`, calling `on_slice` for each chunk
  // in order. A stream that breaks (UNAVAILABLE, or the connection drops) or is refused for
  // memory that frees itself (RESOURCE_EXHAUSTED from the server's stream buffer budget, told
  // by its samplerd-retry-after-ms trailer and waited at least that long, or from gRPC's
  // transport quota, RST_STREAM by its message) is reopened at the next
  // undelivered position with backoff while retries last (retry_budget, max_retries, both counted from the
  // last chunk received); no index is delivered twice. Returns the callback's error (which stops
  // the stream) as it is, or the stream's error naming job, epoch, rank and world size, the
  // position and how long it retried (`job "j" epoch 3 rank 1 of 8: shard stream failed at
  // position P: ...`), whatever its code (a DEADLINE_EXCEEDED too).
  absl::Status StreamShard(const std::string& job, uint64_t epoch, uint32_t rank,
                           uint32_t world_size, uint64_t start_offset, bool with_is_weights,
                           const std::function<absl::Status(const ShardSlice&)>& on_slice);
  // The same, with the options above (chunk size, cancellation).
  absl::Status StreamShard(const std::string& job, uint64_t epoch, uint32_t rank,
                           uint32_t world_size, const StreamShardOptions& options,
                           const std::function<absl::Status(const ShardSlice&)>& on_slice);

  // Convenience: the whole shard in memory.
  absl::StatusOr<std::vector<uint64_t>> ReadShard(const std::string& job, uint64_t epoch,
                                                  uint32_t rank, uint32_t world_size);

  // Sends `batches` on one ReportLosses stream. Batches must be valid LossBatch messages.
  // DATA_LOSS if the server's summary counts another number of batches than were sent.
  absl::StatusOr<v1::LossReportSummary> ReportLosses(absl::Span<const v1::LossBatch> batches);
  // The same for batches of one rank whose claim is `claim` (not null): each attempt sets their
  // incarnation.
  absl::StatusOr<v1::LossReportSummary> ReportLosses(absl::Span<v1::LossBatch> batches,
                                                     ClaimSource* claim);

  // Runs `attempt` until it succeeds, fails with a code other than UNAVAILABLE or CANCELLED
  // (or ABORTED, with a `claim`: Renew is called with the attempt's incarnation first), or the
  // retries run out (ClientOptions), driving the channel's reconnection between attempts. The
  // attempt gets the claim's incarnation (0 without a claim) and makes its own context
  // (PrepareContext sets the deadline and the token). The error names how long it retried.
  absl::Status Retry(const std::function<grpc::Status(uint64_t incarnation)>& attempt,
                     ClaimSource* claim = nullptr);
  // A call's deadline (ClientOptions::timeout from now) and bearer token.
  void PrepareContext(grpc::ClientContext* context) const;

  // The generated stub, for calls this class does not wrap. Its calls carry no bearer token:
  // add ClientOptions::token's "authorization" metadata to their contexts yourself.
  v1::Sampler::Stub* stub() { return stub_.get(); }
  const ClientOptions& options() const { return options_; }

 private:
  SamplerClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // One ReportLosses stream of `count` batches, batch(k, incarnation) the k-th (retried whole).
  absl::StatusOr<v1::LossReportSummary> SendLosses(
      size_t count, const std::function<const v1::LossBatch&(size_t, uint64_t)>& batch,
      ClaimSource* claim);
  // Retry with a fresh prepared context per attempt.
  absl::Status WithRetries(const std::function<grpc::Status(grpc::ClientContext*)>& call);
  // Waits `backoff` before a retry, driving the channel's reconnection meanwhile; true if
  // `cancellation` (may be null) was cancelled meanwhile. A synchronous client's connection
  // attempts progress only while one of its threads polls gRPC: sleeping instead left a server
  // restarted in another process unseen until gRPC's backup poller ran (every 5 s), long after
  // the default retries had run out.
  bool BackOff(absl::Duration backoff, StreamCancellation* cancellation) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
  const ClientOptions options_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_SAMPLER_CLIENT_H_
