"""The proto3 schema served at ``GET /codec/schema`` (codec-spec §1.2, §2.2, §2.7b).

Field numbers are the engines' (``tool_calls = 4``) with the draft's ``base_id = 5``
(§9.1 item 1). As in the forks' served text, a comment says that the msgpack request body
uses the same key names as ``CodecRequest``.
"""

from __future__ import annotations

__all__ = ["PROTO_SCHEMA"]

PROTO_SCHEMA = """\
// Codec wire schema (tokenwire). Response: application/x-protobuf, each frame is a
// 4-byte big-endian length followed by one CodecFrame. The msgpack request body of
// POST /v1/completions/codec (application/x-msgpack) is a map with the same keys as
// CodecRequest.
syntax = "proto3";

package codec;

message CodecFrame {
  repeated uint32   ids           = 1 [packed = true];
  bool              done          = 2;
  optional string   finish_reason = 3;
  repeated ToolCall tool_calls    = 4;
  optional uint32   base_id       = 5;
}

message ToolCall {
  optional string name           = 1;
  string          arguments_json = 2;
  optional string id             = 3;
}

message CodecRequest {
  repeated uint32 prompt_ids    = 1 [packed = true];
  uint32          max_tokens    = 2;
  float           temperature   = 3;
  repeated string stop          = 4;
  string          stream_format = 5;
}
"""
