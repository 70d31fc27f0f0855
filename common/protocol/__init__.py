"""The wire protocol: one module per receiving service, one shared codec.

- `codec`: frame layout, VERSION, encode/decode, ProtocolError.
- `router`: what the router receives (Hello, Heartbeat, PrefillDone, DecodeStep, Finished, Failed,
  Snapshot, NotHeld).
- `prefill`: what a prefill worker receives (PrefillRequest, HoldState).
- `decode`: what a decode worker receives (DecodeRequest).
- `worker`: what every worker receives (HelloAck, Cancel).
- `checks`: what a worker checks against the model before a request reaches native code.
"""
from . import decode, prefill, router, worker
from .codec import VERSION, Message, ProtocolError
from .codec import decode as decode_frames
from .codec import encode as encode_message

__all__ = ["VERSION", "Message", "ProtocolError", "decode_frames", "encode_message",
           "decode", "prefill", "router", "worker"]
