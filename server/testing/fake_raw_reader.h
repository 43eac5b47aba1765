// FakeRawReader: a client stream of raw messages for driving RequestStreamReader without a
// network. The bytes need not be valid protobuf.
#ifndef SAMPLERD_SERVER_TESTING_FAKE_RAW_READER_H_
#define SAMPLERD_SERVER_TESTING_FAKE_RAW_READER_H_

#include <string>
#include <utility>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"

namespace samplerd {

// Hands out the given messages' bytes in order, then ends the stream. Not thread-safe.
class FakeRawReader : public grpc::ServerReaderInterface<grpc::ByteBuffer> {
 public:
  explicit FakeRawReader(std::vector<std::string> messages) : messages_(std::move(messages)) {}
  void SendInitialMetadata() override {}
  bool NextMessageSize(uint32_t* size) override {
    if (next_ >= messages_.size()) return false;
    *size = messages_[next_].size();
    return true;
  }
  bool Read(grpc::ByteBuffer* message) override {
    if (next_ >= messages_.size()) return false;
    grpc::Slice slice(messages_[next_++]);
    *message = grpc::ByteBuffer(&slice, 1);
    return true;
  }
  // Messages handed out so far.
  size_t read() const { return next_; }

 private:
  std::vector<std::string> messages_;
  size_t next_ = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TESTING_FAKE_RAW_READER_H_
