// JSON values printed as YAML (block style) for reading and editing; the
// API parses the YAML back (application/yaml), so the console needs no
// YAML parser. Strings that YAML could read as something else are quoted
// (JSON's quoting is valid YAML).

function plain(s: string): boolean {
  return /^[A-Za-z_/][A-Za-z0-9_./ -]*$/.test(s) && !s.endsWith(" ") && !/^(true|false|null|yes|no|on|off|y|n)$/i.test(s);
}

function scalar(v: unknown): string {
  if (v === null || v === undefined) return "null";
  if (Array.isArray(v)) return "[]";
  if (typeof v === "object") return "{}";
  if (typeof v === "string") return plain(v) ? v : JSON.stringify(v);
  return String(v);
}

function isScalar(v: unknown): boolean {
  if (v === null || typeof v !== "object") return true;
  return Array.isArray(v) ? v.length === 0 : Object.keys(v).length === 0;
}

function lines(v: unknown, ind: string): string[] {
  if (isScalar(v)) return [ind + scalar(v)];
  const out: string[] = [];
  if (Array.isArray(v)) {
    for (const item of v) {
      if (isScalar(item)) {
        out.push(`${ind}- ${scalar(item)}`);
      } else {
        const sub = lines(item, ind + "  ");
        out.push(`${ind}- ${sub[0].slice(ind.length + 2)}`, ...sub.slice(1));
      }
    }
    return out;
  }
  for (const [k, val] of Object.entries(v as Record<string, unknown>)) {
    const key = plain(k) ? k : JSON.stringify(k);
    if (isScalar(val)) out.push(`${ind}${key}: ${scalar(val)}`);
    else out.push(`${ind}${key}:`, ...lines(val, ind + "  "));
  }
  return out;
}

export function toYaml(v: unknown): string {
  return lines(v, "").join("\n") + "\n";
}
