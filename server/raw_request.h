// Parsing of the requests that SamplerService receives as raw bytes (and the serializing of its
// responses, which it sends as raw bytes too).
//
// Why raw: gRPC's generated synchronous handlers parse requests before the handler runs, and
// report a message that does not parse badly. A unary or server-streaming call gets INTERNAL
// with an empty message (protobuf's InitializationErrorString, empty in proto3), though the
// client sent a bad request. In a client stream, ServerReader::Read returns false for an
// unparseable message exactly as for the end of the stream: the handler cannot tell, ends OK,
// and the messages after it are silently dropped. So SamplerService registers its methods with
// grpc::ByteBuffer requests and parses them here, answering INVALID_ARGUMENT with a message that
// names the request type, the reason and, in a stream, the message's position.
//
// Thread-compatible (a RequestStreamReader belongs to one call).
#ifndef SAMPLERD_SERVER_RAW_REQUEST_H_
#define SAMPLERD_SERVER_RAW_REQUEST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/sync_stream.h"

namespace samplerd {

// Parses `raw` into `message` (cleared first). INVALID_ARGUMENT if it does not parse: the message
// names the type and why (a string field that is not valid UTF-8, named with its value, or a
// malformed encoding); `message` is then unspecified. A buffer with no message at all (a call
// whose client sent none) is INVALID_ARGUMENT too.
absl::Status ParseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message);

// `message` serialized into `out`, as a raw method's response (or a server stream's message).
grpc::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* out);

// Parses the messages of a client stream as they arrive (pushed by a callback reactor, or pulled
// by RequestStreamReader); an unparseable message ends the stream with an error that names its
// position ("message 2 of the stream could not be parsed as samplerd.v1.LossBatch: ..."),
// positions counting from 1.
class RequestStreamParser {
 public:
  // The stream's next message, parsed into `message`: true. False if it does not parse (then
  // status() says which), and on every call after that.
  bool Parse(const grpc::ByteBuffer& raw, google::protobuf::Message* message);

  // OK while every message parsed; INVALID_ARGUMENT once one did not.
  const absl::Status& status() const { return status_; }

  // Messages parsed so far.
  int64_t parsed() const { return parsed_; }

 private:
  absl::Status status_;
  int64_t parsed_ = 0;
};

// Reads the messages of a client stream one by one, parsing each; an unparseable message ends
// the stream with an error that names its position ("message 2 of the stream could not be
// parsed as samplerd.v1.LossBatch: ..."), positions counting from 1.
//
//   RequestStreamReader stream(reader);
//   while (stream.Next(&batch)) { ... }
//   if (!stream.status().ok()) { ... the stream ended at a bad message ... }
class RequestStreamReader {
 public:
  // `reader` must outlive this object.
  explicit RequestStreamReader(grpc::ServerReaderInterface<grpc::ByteBuffer>* reader)
      : reader_(reader) {}

  // The next message, parsed into `message`: true. False at the end of the stream, or at a
  // message that does not parse (then status() says which), and on every call after that.
  bool Next(google::protobuf::Message* message);

  // OK at the end of the stream and while reading; INVALID_ARGUMENT once a message did not parse.
  const absl::Status& status() const { return parser_.status(); }

  // Messages read and parsed so far.
  int64_t parsed() const { return parser_.parsed(); }

 private:
  grpc::ServerReaderInterface<grpc::ByteBuffer>* const reader_;
  grpc::ByteBuffer raw_;  // Reused across messages.
  RequestStreamParser parser_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_RAW_REQUEST_H_
