// Unit tests of what the editor makes of a `POST /v1/validate` answer
// (src/check.ts `problemsOf`): each error and warning at its line. The
// messages are the server's, as tests/e2e/console.rs sees them.

import { done, eq } from "./assert";
import { problemsOf } from "../src/check";

const TEXT = `apiVersion: networking.istio.io/v1
kind: Policy
metadata: {name: first}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: typed
  namespace: shop
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
  - route:
    - destination:
        host: reviews.shop.svc.cluster.local
      weight: 150
    retriez: 3
    timeout: 1ms
`;

const at = (line: number, column: number) => ({ line, column });

eq(
  "a schema error, at its field",
  problemsOf(TEXT, {
    valid: false,
    error: { code: "InvalidArgument", message: "...", fields: [{ field: "resources[1].spec.http[0].route[0].weight", reason: "weight 150 must be in the range 0..=100" }] },
  }),
  [{ level: "error", message: "resources[1].spec.http[0].route[0].weight: weight 150 must be in the range 0..=100", at: at(16, 7) }],
);
eq(
  "a syntax error, at the parser's place",
  problemsOf(TEXT, {
    valid: false,
    error: { code: "InvalidArgument", message: "...", fields: [{ field: "body[1]", reason: "malformed YAML: found character that cannot start any token at line 9 column 1, while scanning for the next token" }] },
  }),
  [{ level: "error", message: "body[1]: malformed YAML: found character that cannot start any token at line 9 column 1, while scanning for the next token", at: at(9, 1) }],
);
eq("an error without fields", problemsOf(TEXT, { valid: false, error: { code: "InvalidArgument", message: "no resources given" } }), [
  { level: "error", message: "no resources given", at: null },
]);
eq(
  "warnings: an unknown field, a spec's own, an analyzer's (at its document), another object's (nowhere)",
  problemsOf(TEXT, {
    valid: true,
    revision: 7,
    warnings: [
      "resources[1] (virtualservices/shop/typed): unknown field spec.http[0].retriez dropped (fieldValidation=Strict refuses it)",
      "resources[1] (virtualservices/shop/typed): spec.http[0].timeout: a timeout under 1s",
      "Error [IST0109] (VirtualService shop/typed) The VirtualServices shop/reviews,shop/typed associated with mesh gateway define the same host",
      "Error [IST0109] (VirtualService shop/reviews) The VirtualServices shop/reviews,shop/typed associated with mesh gateway define the same host",
    ],
  }).map((p) => [p.level, p.at]),
  [
    ["warning", at(17, 5)],
    ["warning", at(18, 5)],
    ["warning", at(5, 1)],
    ["warning", null],
  ],
);
eq("valid, nothing to say", problemsOf(TEXT, { valid: true, revision: 7, warnings: [] }), []);

done("check");
