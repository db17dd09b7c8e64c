// A proxyless Node gRPC client (@grpc/grpc-js-xds): the same protocol as
// client.py. Resolves `xds:///...` targets through the bootstrap in
// GRPC_XDS_BOOTSTRAP, with no Envoy. One channel per target, kept across
// commands. Reads one JSON command a line on stdin and answers one JSON
// line on stdout:
//
//   {"target": "echo.shop.svc.cluster.local:50051", "calls": 1000,
//    "method": "/lodestar.test.Echo/Call", "metadata": {"x-canary": "yes"},
//    "timeout": 5}
//   -> {"replies": {"v1 /lodestar.test.Echo/Call": 800, ...}, "errors": {"UNAVAILABLE: ...": 3}}
//
// Every loop is bounded by "calls". Calls are made one after another, as
// client.py does.
'use strict';

const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();
const readline = require('readline');

const clients = new Map();

function client(target) {
  if (!clients.has(target)) {
    clients.set(target, new grpc.Client(`xds:///${target}`, grpc.credentials.createInsecure()));
  }
  return clients.get(target);
}

const raw = (b) => b;

function callOnce(c, method, metadata, timeoutSecs) {
  return new Promise((resolve) => {
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(metadata)) md.set(k, v);
    const deadline = new Date(Date.now() + timeoutSecs * 1000);
    c.makeUnaryRequest(method, raw, raw, Buffer.alloc(0), md, { deadline }, (err, reply) => {
      if (err) {
        const code = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code) || String(err.code);
        resolve({ error: `${code}: ${err.details}` });
      } else {
        resolve({ reply: reply.toString() });
      }
    });
  });
}

async function run(cmd) {
  const c = client(cmd.target);
  const method = cmd.method || '/lodestar.test.Echo/Call';
  const replies = {};
  const errors = {};
  const calls = Number(cmd.calls);
  for (let i = 0; i < calls; i++) {
    const r = await callOnce(c, method, cmd.metadata || {}, Number(cmd.timeout || 5));
    if (r.error !== undefined) errors[r.error] = (errors[r.error] || 0) + 1;
    else replies[r.reply] = (replies[r.reply] || 0) + 1;
  }
  return { replies, errors };
}

async function main() {
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let out;
    try {
      out = await run(JSON.parse(line));
    } catch (e) {
      out = { fatal: String(e) };
    }
    process.stdout.write(JSON.stringify(out) + '\n');
  }
  process.exit(0);
}

main();
