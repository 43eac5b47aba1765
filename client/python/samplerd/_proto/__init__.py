"""Generated protobuf/gRPC modules of proto/samplerd.proto (tools/gen_python_stubs.sh)."""
