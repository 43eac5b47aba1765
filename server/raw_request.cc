#include "server/raw_request.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
// IsStructurallyValidUTF8: the very check protobuf applies to proto3 strings when parsing.
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace samplerd {
namespace {

// Longest prefix of a bad string value quoted in an error.
constexpr size_t kMaxQuotedBytes = 64;

// Why `bytes` do not parse as `type`. Diagnosed only after a failed parse, so it costs nothing
// on the good path: bytes that are well-formed wire format but do not parse have a string field
// that is not valid UTF-8 (proto3 has no required fields); name it if it is a top-level one.
std::string WhyUnparseable(const std::string& bytes, const google::protobuf::Descriptor& type) {
  google::protobuf::UnknownFieldSet fields;
  if (fields.ParseFromString(bytes)) {
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::UnknownField& f = fields.field(i);
      if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      const google::protobuf::FieldDescriptor* field = type.FindFieldByNumber(f.number());
      if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
          google::protobuf::internal::IsStructurallyValidUTF8(f.length_delimited())) {
        continue;
      }
      const std::string& value = f.length_delimited();
      return absl::StrCat(field->name(), " = \"",
                          absl::CHexEscape(absl::string_view(value).substr(0, kMaxQuotedBytes)),
                          value.size() > kMaxQuotedBytes ? "...\"" : "\"",
                          " is not valid UTF-8 (proto3 strings must be)");
    }
  }
  return absl::StrCat("not a valid protobuf encoding (", bytes.size(), " bytes)");
}

// Parses `raw` into `message`; on failure, the reason (without the type).
bool Parse(const grpc::ByteBuffer& raw, google::protobuf::Message* message, std::string* why) {
  if (!raw.Valid()) {
    *why = "no message";
    return false;
  }
  grpc::ByteBuffer copy(raw);  // Shares the slices; the reader needs a mutable buffer.
  {
    grpc::ProtoBufferReader reader(&copy);
    if (reader.status().ok() && message->ParseFromZeroCopyStream(&reader)) return true;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (raw.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  *why = WhyUnparseable(bytes, *message->GetDescriptor());
  return false;
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message) {
  std::string why;
  if (Parse(raw, message, &why)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the request could not be parsed as ", message->GetTypeName(), ": ", why));
}

bool RequestStreamParser::Parse(const grpc::ByteBuffer& raw, google::protobuf::Message* message) {
  if (!status_.ok()) return false;
  std::string why;
  if (!samplerd::Parse(raw, message, &why)) {
    status_ = absl::InvalidArgumentError(absl::StrCat("message ", parsed_ + 1,
                                                      " of the stream could not be parsed as ",
                                                      message->GetTypeName(), ": ", why));
    return false;
  }
  ++parsed_;
  return true;
}

bool RequestStreamReader::Next(google::protobuf::Message* message) {
  if (!parser_.status().ok() || !reader_->Read(&raw_)) return false;
  const bool parsed = parser_.Parse(raw_, message);
  raw_.Clear();
  return parsed;
}

grpc::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  return grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, out,
                                                                        &own_buffer);
}

}  // namespace samplerd
