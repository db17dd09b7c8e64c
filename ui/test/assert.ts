// The unit tests' one assertion and their verdict (no test framework:
// ui/build.sh runs each test/*.test.ts bundled for Node).

let failures = 0;

/** `got` must equal `want` (compared as JSON). */
export function eq(what: string, got: unknown, want: unknown): void {
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    failures++;
    console.error(`FAIL ${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  }
}

/** Throws (the build fails) if any `eq` failed. */
export function done(name: string): void {
  if (failures) throw new Error(`${failures} ${name} test(s) failed`);
  console.log(`${name}: ok`);
}
