// ClientStreamReactor: the callback reactor of a client-streaming method (UploadWeights,
// UploadLabels, ReportLosses). It reads one message at a time (a pending read holds no thread)
// and hands each to its Stream (client_streams.h) on the WorkPool; the Stream's status, or at the
// end of the stream its End and response, finish the call.
//
// The caller's token is checked before the first read (MethodGate::CallerOf); the job of each
// message is checked by the Stream as it reads it (Caller::MayUseJob).
//
// Owns itself: deleted in OnDone, which gRPC calls after Finish.
#ifndef SAMPLERD_SERVER_CLIENT_STREAM_REACTOR_H_
#define SAMPLERD_SERVER_CLIENT_STREAM_REACTOR_H_

#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "proto/status_util.h"
#include "server/method_gate.h"
#include "server/raw_request.h"
#include "server/service_calls.h"

namespace samplerd {

template <typename Stream>
class ClientStreamReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // Starts a call of `method`: `make(caller, &response)` builds its Stream once its caller is
  // known. `calls` and `gate` must outlive the call.
  template <typename Make>
  static ClientStreamReactor* Start(ServiceCalls* calls, const MethodGate* gate,
                                    SamplerMethod method, grpc::CallbackServerContext* context,
                                    grpc::ByteBuffer* raw_response, Make make) {
    calls->Begin(method);
    auto* reactor = new ClientStreamReactor(calls, method, raw_response);
    absl::StatusOr<Caller> caller = gate->CallerOf(*context);
    if (!caller.ok()) {
      reactor->Finish(ToGrpcStatus(caller.status()));
      return reactor;
    }
    reactor->stream_.emplace(make(*std::move(caller), &reactor->response_));
    reactor->StartRead(&reactor->raw_);
    return reactor;
  }

  void OnReadDone(bool ok) override {
    // `this` lives until OnDone, which comes after Finish: the work below calls Finish last.
    if (ok) {
      calls_->Schedule(method_, [this] {
        std::optional<grpc::Status> ended = stream_->Add(raw_);
        raw_.Clear();
        if (ended.has_value()) {
          Finish(*ended);
        } else {
          StartRead(&raw_);
        }
      });
    } else {
      calls_->Schedule(method_, [this] {
        grpc::Status status = stream_->End();
        if (status.ok()) status = SerializeResponse(response_, raw_response_);
        Finish(status);
      });
    }
  }

  void OnDone() override {
    ServiceCalls* const calls = calls_;
    const SamplerMethod method = method_;
    delete this;
    calls->End(method);
  }

 private:
  ClientStreamReactor(ServiceCalls* calls, SamplerMethod method, grpc::ByteBuffer* raw_response)
      : calls_(calls), method_(method), raw_response_(raw_response) {}

  ServiceCalls* const calls_;
  const SamplerMethod method_;
  grpc::ByteBuffer* const raw_response_;
  typename Stream::Response response_;
  std::optional<Stream> stream_;
  grpc::ByteBuffer raw_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CLIENT_STREAM_REACTOR_H_
