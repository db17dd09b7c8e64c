"""A proxyless gRPC client: resolves `xds:///...` targets through the xDS
bootstrap in GRPC_XDS_BOOTSTRAP (Lodestar), with no Envoy. One process, one
channel per target, kept across commands (so a test can fail the replica it
talks to and go on). Reads one JSON command a line on stdin and answers one
JSON line on stdout:

    {"target": "echo.shop.svc.cluster.local:50051", "calls": 1000,
     "method": "/lodestar.test.Echo/Call", "metadata": {"x-canary": "yes"},
     "timeout": 5}

With "address": "IP:PORT" the channel dials that address (a gateway
Envoy) instead, sending the target as the authority.
    -> {"replies": {"v1 /lodestar.test.Echo/Call": 800, ...}, "errors": {"UNAVAILABLE: ...": 3}}

Every loop is bounded by "calls".
"""
import json
import sys

import grpc

channels = {}


def channel(target, address=None):
    """`xds:///target`, or with an address (an Envoy's), a plain channel to
    it that sends `target` as the authority."""
    key = (target, address)
    if key not in channels:
        if address:
            channels[key] = grpc.insecure_channel(address, options=[("grpc.default_authority", target)])
        else:
            channels[key] = grpc.insecure_channel(f"xds:///{target}")
    return channels[key]


def run(cmd):
    ch = channel(cmd["target"], cmd.get("address"))
    call = ch.unary_unary(cmd.get("method", "/lodestar.test.Echo/Call"))
    metadata = tuple((k, v) for k, v in cmd.get("metadata", {}).items())
    replies, errors = {}, {}
    for _ in range(int(cmd["calls"])):
        try:
            r = call(b"", metadata=metadata, timeout=float(cmd.get("timeout", 5))).decode()
            replies[r] = replies.get(r, 0) + 1
        except grpc.RpcError as e:
            k = f"{e.code().name}: {e.details()}"
            errors[k] = errors.get(k, 0) + 1
    return {"replies": replies, "errors": errors}


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            out = run(json.loads(line))
        except Exception as e:  # a bad command: say so, keep going
            out = {"fatal": repr(e)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
