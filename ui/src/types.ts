// The API's answers, as far as the console reads them.

export interface Who {
  who: string;
  clusterRead: boolean;
  management: boolean;
}

export interface NodeStatus {
  id: number;
  state: string;
  term: number;
  leader: number | null;
  applied_index: number;
  revision: number;
  xds_streams: number;
  ready: boolean;
}

export interface Member {
  id: number;
  info: { api_addr: string; raft_addr: string; xds_addr: string };
  role: string;
  status: NodeStatus | null;
  error: string | null;
}

export interface ClusterStatus {
  leader: number | null;
  term: number;
  members: Member[];
}

export interface Nack {
  rejected_version: string;
  error: string;
  at_unix_ms: number;
}

export interface TypeStatus {
  sent_version: string | null;
  acked_version: string | null;
  last_nack: Nack | null;
  in_sync: boolean;
}

export interface ProxyStatus {
  id: string;
  kind: string;
  ip: string;
  name: string;
  namespace: string;
  protocol: string;
  connected_at_unix_ms: number;
  revision: number | null;
  generate_error: string | null;
  types: Record<string, TypeStatus>;
}

export interface Syncz {
  proxies: ProxyStatus[];
}

export interface Ref {
  kind: string;
  namespace: string;
  name: string;
}

export interface Finding {
  code: string;
  level: "Error" | "Warning" | "Info";
  resource?: Ref;
  message: string;
  field?: string;
}

export interface Analysis {
  revision: number;
  messages: Finding[];
}

export interface Metadata {
  name: string;
  namespace?: string;
  labels?: Record<string, string>;
  modRevision?: number;
  creationRevision?: number;
  generation?: number;
  [k: string]: unknown;
}

export interface Resource {
  apiVersion?: string;
  kind: string;
  metadata: Metadata;
  spec?: Record<string, unknown>;
  [k: string]: unknown;
}

export interface FieldChange {
  path: string;
  before?: unknown;
  after?: unknown;
  redacted?: boolean;
}

export interface Change extends Ref {
  action: string;
  diff: FieldChange[];
}

export interface Preview {
  dryRun: boolean;
  baseRevision: number;
  revision: number;
  changes: Change[];
  warnings?: string[];
  proxies?: ProxiesPreview;
  [k: string]: unknown;
}

/** A dry run's effect on connected proxies (one replica's, or merged). */
export interface ProxiesPreview {
  replicas: number[];
  unchanged: number;
  changed: ProxyEffect[];
  failed?: { proxy: string; replica: number; error: string }[];
  hidden?: string;
}

export interface ProxyEffect {
  proxy: string;
  replica: number;
  kind: string;
  namespace: string;
  lostClusters?: string[];
  changes: { type: string; name: string; action: string; diff?: FieldChange[] }[];
}

export interface WriteResult {
  revision: number;
  items: (Ref & { action: string })[];
  warnings?: string[];
}

export interface HistoryAnswer {
  revision: number;
  oldest: number;
  revisions: { revision: number; author?: string; message?: string; changes: (Ref & { action: string; version: number })[] }[];
}

export interface WaitReport {
  revision: number;
  converged: boolean;
  proxies: number;
  synced: number;
  pending: string[];
  nacked: string[];
  unreachable: string[];
}

export interface ServiceView {
  hostname: string;
  namespace: string;
  declared: boolean;
  ports: string[];
  instances: number;
  healthy: number;
  unhealthy: number;
  unknown: number;
}

export interface ConfigDump {
  proxy: string;
  revision: number;
  [type: string]: unknown;
}

/** A NACK a proxy sent (`/v1/nacks/recent`). */
export interface NackEvent {
  proxy: string;
  id: string;
  type: string;
  rejectedVersion: string;
  error: string;
  atUnixMs: number;
}

export interface RecentNacks {
  replica: number;
  sinceUnixMs: number;
  nacks: NackEvent[];
}

export interface Via {
  kind: string;
  namespace: string;
  name: string;
  role: "route" | "egress" | "destination" | "allow" | "deny" | "audit" | "custom";
}

export interface TopologyNode {
  hostname: string;
  namespace: string;
  instances: number;
  sidecar?: Via;
  applies: Via[];
}

export interface TopologyEdge {
  from: string;
  fromNamespace: string;
  to: string;
  toNamespace: string;
  host?: string;
  verdict: "allowed" | "denied" | "conditional";
  reason: string;
  via: Via[];
}

/** Who may call whom (`/v1/topology`). */
export interface Topology {
  revision: number;
  services: TopologyNode[];
  edges: TopologyEdge[];
  truncated?: boolean;
}
