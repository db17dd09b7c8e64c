"""A loopback gRPC server for the proxyless tests: every unary method
(`/lodestar.test.Echo/Call`, `/lodestar.test.Echo/Debug`, ...) answers with
this server's identity and the method, as raw bytes (no protobuf, no
generated code). With `flaky`, every other call (the 1st, 3rd, ...) fails
with UNAVAILABLE instead. Prints "ready" once it listens.

    python server.py IP PORT IDENTITY [flaky]
"""
import itertools
import sys
import threading
from concurrent import futures

import grpc


def main():
    ip, port, identity = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    flaky = sys.argv[4:] == ["flaky"]
    calls, lock = itertools.count(), threading.Lock()

    class Any(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method

            def unary(request, context):
                with lock:
                    n = next(calls)
                if flaky and n % 2 == 0:
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"{identity}: failing call {n}")
                return f"{identity} {method}".encode()

            return grpc.unary_unary_rpc_method_handler(unary)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Any(),))
    server.add_insecure_port(f"{ip}:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
