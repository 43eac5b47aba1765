// RpcMetricsInterceptorFactory: a gRPC server interceptor that counts, times and logs every RPC
// of the server it is installed in (ServerBuilder::experimental().SetInterceptorCreators), so
// that no handler carries instrumentation:
//
//   samplerd_rpcs_total{service, method, code}      calls finished, by status code
//   samplerd_rpc_duration_seconds{service, method}  time from arrival to the status (for a
//                                                   stream, its whole life)
//   samplerd_rpcs_in_flight{service, method}        calls running now (open streams included)
//
// Logs: every call ending INTERNAL, DATA_LOSS or RESOURCE_EXHAUSTED (what an operator must act
// on) as one line `event=rpc_error method=... code=... ms=... message=...`; at --v=1 every call
// as `event=rpc method=... code=... ms=...`.
//
// Only the services named at construction get their own labels; a call of any other path (a
// client's typo) is counted as service="other", method="other", so that clients cannot create
// series without bound.
//
// Thread-safe. The registry must outlive the factory and every call's interceptor.
#ifndef SAMPLERD_SERVER_METRICS_RPC_INTERCEPTOR_H_
#define SAMPLERD_SERVER_METRICS_RPC_INTERCEPTOR_H_

#include <memory>
#include <set>
#include <string>

#include "grpcpp/support/server_interceptor.h"
#include "server/metrics/registry.h"

namespace samplerd {
namespace metrics {

class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // Adds the three families above to `registry`. `services`: full names of the services served
  // (e.g. "samplerd.v1.Sampler", "grpc.health.v1.Health").
  RpcMetricsInterceptorFactory(Registry* registry, std::set<std::string> services);

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  class Interceptor;

  const std::set<std::string> services_;
  Family<Counter>* const calls_;
  Family<Histogram>* const durations_;
  Family<Gauge>* const in_flight_;
};

}  // namespace metrics
}  // namespace samplerd

#endif  // SAMPLERD_SERVER_METRICS_RPC_INTERCEPTOR_H_
