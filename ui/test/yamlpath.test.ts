// Unit tests of the path->line mapper (src/yamlpath.ts): ui/build.sh
// bundles this file for Node with esbuild and runs it; any failure fails
// the build (and `ui/build.sh --check`, which tests/run runs).

import { eq, done } from "./assert";
import { documentOf, locate, messagePlace, offsetOf, scalarAt, steps } from "../src/yamlpath";

const VS = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
  namespace: shop
spec:
  hosts:
  - reviews
  http:
  - match:
    - uri: {prefix: /a}
    route:
    - destination: {host: a}
      weight: 150
    - destination:
        host: b   # a comment
      weight: -1

  - route:
      - destination: {host: c}
    headers:
      request:
        set: {"x-flag": "true"}
        "x-quoted": 1
`;

const at = (line: number, column: number) => ({ line, column });
for (const [path, want] of [
  ["resources[0].spec.http[0].route[0].weight", at(14, 7)],
  ["resources[0].spec.http[0].route[1].weight", at(17, 7)],
  ["resources[0].spec.http[0].route[1].destination.host", at(16, 9)],
  ["resources[0].spec.http[1].route[0]", at(20, 7)],
  ["resources[0].spec.http[1].route[0].destination.host", at(20, 9)],
  ["resources[0].spec.http[1].headers.request.x-quoted", at(24, 9)],
  ["resources[0].spec.hosts[0]", at(8, 3)],
  ["resources[0].metadata.name", at(4, 3)],
  ["resources[0].kind", at(2, 1)],
  // Into a flow mapping: its key.
  ["resources[0].spec.http[0].match[0].uri.prefix", at(11, 7)],
  // A field the text lacks: the deepest one it has.
  ["resources[0].spec.tcp[0].route", at(6, 1)],
  ["resources[0].spec.http[0].route[5].weight", at(12, 5)],
  ["resources[0]", at(1, 1)],
  ["body[0]", at(1, 1)],
  ["body", at(1, 1)],
  ["resources[1].spec", null],
] as [string, unknown][]) {
  eq(path, locate(VS, path), want);
}

// Documents as the server counts them: empty ones do not count.
const STREAM = `---
# only a comment
---
kind: A
metadata: {name: a}
---
kind: B
spec:
  hosts:
  - x
  - y
  gateways:
  - g
...
`;
eq("second document", locate(STREAM, "resources[1].spec.hosts[1]"), at(11, 3));
eq("a list at the key's column ends at the next key", locate(STREAM, "resources[1].spec.gateways[0]"), at(13, 3));
eq("first document", locate(STREAM, "resources[0].metadata.name"), at(5, 1));
eq("a document begun on its marker line", locate("--- kind: A\n", "resources[0].kind"), at(1, 5));

eq("a scalar", scalarAt(STREAM, "resources[1].kind"), "B");
eq("a scalar before a comment", scalarAt(VS, "resources[0].spec.http[0].route[1].destination.host"), "b");
eq("not a scalar", scalarAt(VS, "resources[0].spec"), null);
eq("a document by kind and name", documentOf(`kind: A\nmetadata:\n  name: a\n---\nkind: B\nmetadata:\n  name: "b"\n`, "B", "b"), 1);
eq("no such document", documentOf("kind: A\n---\nkind: B\n", "C", "c"), null);
eq("the only document", documentOf("kind: A\nmetadata: {name: a}\n", "A", "a"), 0);

eq("steps", steps("resources[0].spec.http[12].route"), ["resources", 0, "spec", "http", 12, "route"]);
eq("a parser's place", messagePlace("body[0]: malformed YAML: did not find expected key at line 5 column 3, while parsing a block mapping at line 2 column 1"), at(5, 3));
eq("no place", messagePlace("resources[0].spec.hosts: required"), null);
eq("offset", offsetOf("ab\ncde\n", at(2, 2)), 4);
eq("offset past the line's end", offsetOf("ab\ncde\n", at(1, 9)), 2);

done("yamlpath");
