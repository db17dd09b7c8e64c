#!/usr/bin/env python3
"""Seed the `xds` and `rest` fuzz corpora from tests/fixtures.

xds: for each translate fixture's proxy.json (node id and metadata), a
state-of-the-world and a delta input: the target's first byte (0 SotW,
1 delta), then gRPC-framed requests (a subscription carrying the node,
an ACK, a NACK, a named EDS/RDS subscription), protobuf encoded by hand
(the wire format is small; no protobuf package needed).

rest: each Istio fixture and translate input as a YAML apply body, and
as JSON apply/delete bodies (the target's first byte picks the route and
content type, fuzz_targets/rest.rs).

    fuzz/seeds.py CORPUS_DIR   (writes CORPUS_DIR/xds and CORPUS_DIR/rest)
"""
import glob, json, os, struct, sys

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)

def field(num, payload):  # length-delimited
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload

def value(v):  # google.protobuf.Value
    if v is None:
        return varint(1 << 3) + varint(0)
    if isinstance(v, bool):
        return varint(4 << 3) + varint(int(v))
    if isinstance(v, (int, float)):
        return varint(2 << 3 | 1) + struct.pack("<d", float(v))
    if isinstance(v, str):
        return field(3, v)
    if isinstance(v, dict):
        return field(5, struct_(v))
    return field(6, b"".join(field(1, value(x)) for x in v))  # ListValue

def struct_(d):  # google.protobuf.Struct: map<string, Value> fields = 1
    return b"".join(field(1, field(1, k) + field(2, value(v))) for k, v in d.items())

def node(proxy):
    return field(1, proxy["id"]) + (field(3, struct_(proxy["metadata"])) if proxy.get("metadata") else b"")

def frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg

T = "type.googleapis.com/envoy.config.%s"
CDS, EDS, LDS, RDS = T % "cluster.v3.Cluster", T % "endpoint.v3.ClusterLoadAssignment", T % "listener.v3.Listener", T % "route.v3.RouteConfiguration"
EDS_NAME = "outbound|80||s0.default.svc.cluster.local"

def sotw(proxy):
    # DiscoveryRequest: version_info 1, node 2, resource_names 3, type_url 4,
    # response_nonce 5, error_detail 6 (google.rpc.Status: message 2).
    reqs = [
        field(2, node(proxy)) + field(4, CDS),
        field(1, "7") + field(4, CDS) + field(5, "1"),
        field(3, EDS_NAME) + field(4, EDS),
        field(4, LDS) + field(6, field(2, "rejected")) + field(5, "3"),
        field(3, "8080") + field(4, RDS),
    ]
    return b"\0" + b"".join(frame(r) for r in reqs)

def delta(proxy):
    # DeltaDiscoveryRequest: node 1, type_url 2, subscribe 3, unsubscribe 4,
    # initial_resource_versions 5 (map<string,string>), response_nonce 6,
    # error_detail 7.
    reqs = [
        field(1, node(proxy)) + field(2, CDS) + field(5, field(1, EDS_NAME) + field(2, "0")),
        field(2, CDS) + field(6, "1"),
        field(2, EDS) + field(3, EDS_NAME) + field(3, "*"),
        field(2, EDS) + field(4, EDS_NAME) + field(6, "2") + field(7, field(2, "rejected")),
    ]
    return b"\1" + b"".join(frame(r) for r in reqs)

def main(out):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    os.makedirs(os.path.join(out, "xds"), exist_ok=True)
    os.makedirs(os.path.join(out, "rest"), exist_ok=True)
    for p in sorted(glob.glob(os.path.join(root, "translate", "*", "proxy.json"))):
        name = os.path.basename(os.path.dirname(p))
        proxy = json.load(open(p))
        open(os.path.join(out, "xds", name + "-sotw"), "wb").write(sotw(proxy))
        open(os.path.join(out, "xds", name + "-delta"), "wb").write(delta(proxy))
    docs = sorted(glob.glob(os.path.join(root, "istio", "*", "*.yaml"))) + sorted(glob.glob(os.path.join(root, "translate", "*", "input.yaml")))
    for p in docs:
        name = os.path.relpath(p, root).replace(os.sep, "-")
        text = open(p, "rb").read()
        open(os.path.join(out, "rest", name + "-apply-yaml"), "wb").write(b"\1" + text)
        open(os.path.join(out, "rest", name + "-delete-yaml"), "wb").write(b"\3" + text)
    wrapped = {"resources": [{"resource": {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "r", "namespace": "default"}, "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}},
               "expectedRevision": 3}]}
    open(os.path.join(out, "rest", "apply-json-expected-revision"), "wb").write(b"\0" + json.dumps(wrapped).encode())
    refs = {"resources": [{"kind": "VirtualService", "namespace": "default", "name": "r", "expectedRevision": 4}], "ignoreNotFound": True}
    open(os.path.join(out, "rest", "delete-json-refs"), "wb").write(b"\2" + json.dumps(refs).encode())

if __name__ == "__main__":
    main(sys.argv[1])
