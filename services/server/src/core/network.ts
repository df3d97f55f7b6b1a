/**
 * The network part of the sandbox lifecycle (docs/network.md): what a create or fork asks for
 * and what the node can give, the ingress access token, the NetworkDirectory kept in step with
 * the records, the orphan sweep of network slots and the check of adopted VMs' networks.
 * Kernel state is the vmm-supervisor's (VmPort: NetworkSpec, keep_network, slot RPCs); this
 * file decides and records.
 *
 * Access tokens: a sandbox's token is HMAC-SHA256(node key, "sandnode-access-token\0" + id),
 * 32 bytes as 43 base64url characters; the node key is 32 random bytes kept in
 * <stateDir>/access-token.key (0600, made once). The record keeps only the token's SHA-256 (what
 * the ingress checks), so a leaked records.db gives no token; a CreateSandbox or ForkSandbox
 * repeated by request_id derives the same token again (the key is needed, not stored tokens).
 */
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError, formatEgressPolicy, InvalidArgumentError, parseCidrList, parseEgressPolicy, SANDBOX_ID_RE, unreachableAllows, type Logger } from '@sandnode/shared';
import type { MapNetworkDirectory, SandboxNetworkView } from './network-directory';
import type { EgressPolicyWire, NetworkRef, NodeNetwork, RecordStore, SandboxRecord, VmInfo, VmNetworkInfo, VmPort } from './types';

/** Bytes of an access token (and of the node key). */
export const ACCESS_TOKEN_BYTES = 32;
/** The node key's file name in the state dir. */
export const ACCESS_TOKEN_KEY_FILE = 'access-token.key';

/** A create's or fork's network request as the API gives it (server.v1 SandboxNetworkRequest). */
export interface NetworkRequest {
  disabled: boolean;
  egress: EgressPolicyWire | undefined;
  public: boolean;
}

/** A validated request: undefined (none asked: the node's default), 'disabled', or a canonical policy. */
export type NetworkChoice = undefined | 'disabled' | { egress: EgressPolicyWire; public: boolean };

/**
 * validateNetworkRequest checks a request's policy with the shared parser (canonical: sorted,
 * deduplicated). Throws InvalidArgumentError naming `${field}.egress.allow_out[i]` etc.
 */
export function validateNetworkRequest(field: string, req: NetworkRequest | undefined): NetworkChoice {
  if (!req) return undefined;
  const egress = canonicalPolicy(req.egress, `${field}.egress`);
  return req.disabled ? 'disabled' : { egress, public: req.public };
}

/** canonicalPolicy parses a wire policy (InvalidArgumentError naming field) and gives it back canonical. */
export function canonicalPolicy(p: EgressPolicyWire | undefined, field: string): EgressPolicyWire {
  return formatEgressPolicy(parseEgressPolicy(p ? { allowOut: p.allowOut ?? [], denyOut: p.denyOut ?? [], blockAll: p.blockAll ?? false } : undefined, field));
}

/**
 * checkAllowsReachable refuses (InvalidArgumentError naming `field`) a policy whose allow_out
 * holds a CIDR wholly inside one of the node's always-denied ranges (NodeNetwork.alwaysDenied:
 * vmm-supervisor key networkAlwaysDenied, the slot pool, the node's own addresses): the kernel and the
 * egress proxy deny it first, so the entry would be accepted and never work (newcomer finding:
 * `--allow-out 10.1.2.3` was taken silently and its connections refused).
 */
export function checkAllowsReachable(egress: EgressPolicyWire, alwaysDenied: readonly string[], field: string): void {
  // the supervisor's list; an entry this server cannot read is not held against the caller
  const denied = alwaysDenied.flatMap((t) => {
    try {
      return parseCidrList([t], 'always-denied');
    } catch {
      return [];
    }
  });
  const bad = unreachableAllows(parseEgressPolicy(egress, field), denied);
  if (bad.length === 0) return;
  const list = bad.map((b) => `${b.allow} (inside ${b.deniedBy})`).join(', ');
  throw new InvalidArgumentError(
    `${field}.allow_out: ${list}: this node always denies ${bad.length === 1 ? 'that range' : 'those ranges'} (private, link-local and loopback ranges, the sandbox pool, the node's own addresses; the operator's vmm-supervisor key networkAlwaysDenied), so the entry could never allow a connection; nothing was changed`,
  );
}

/** nodeNetwork asks the supervisor for the node's network; a port without networkStatus has none. */
export async function nodeNetwork(vms: VmPort): Promise<NodeNetwork> {
  if (!vms.networkStatus) return { available: false, reason: 'the vmm-supervisor port has no network', slots: [], pool: '', dnsPort: 0, egressProxyPort: 0, proxiedPorts: [], alwaysDenied: [] };
  return vms.networkStatus();
}

/**
 * planNetwork decides a new sandbox's network before anything is made: none asked -> the
 * default policy iff the node has network, else none; disabled -> none; a policy -> that one,
 * or FailedPreconditionError (FAILED_PRECONDITION) naming the supervisor, its version and why
 * when the node cannot give one (unless `optional`: a policy not asked for by the caller, e.g. a
 * fork's inherited one, then none). Returns the NetworkRef to record (slot -1: any free one).
 */
export async function planNetwork(vms: VmPort, choice: NetworkChoice, what: string, token: AccessTokens, id: string, optional = false): Promise<NetworkRef | undefined> {
  if (choice === 'disabled') return undefined;
  const node = await nodeNetwork(vms);
  if (!node.available) {
    if (choice === undefined || optional) return undefined;
    throw new FailedPreconditionError(`${what}: the sandbox asks for a network, but ${node.reason}; ask for none (network.disabled, \`--no-network\`) on this node; nothing was created`);
  }
  const c = choice ?? { egress: canonicalPolicy(undefined, 'egress'), public: false };
  // a policy the caller sent (not a fork's inherited one, accepted when its parent was made)
  if (choice && !optional) checkAllowsReachable(c.egress, node.alwaysDenied, 'network.egress');
  return { slot: -1, address: '', gateway: '', egress: c.egress, public: c.public, accessTokenSha256: token.sha256(token.tokenOf(id)), hostIfname: '' };
}

/**
 * applyVmNetwork copies the network the supervisor gave the VM into rec.network. Throws
 * FailedPreconditionError when the VM came without one (a supervisor that ignored
 * VmSpec.network: it was replaced by one without "vmm.network.v1" since it was asked) or on
 * another slot than the one asked for (resume keeps its slot).
 */
export function applyVmNetwork(rec: SandboxRecord, vm: VmInfo): void {
  const n = rec.network;
  if (!n) return;
  const got = vm.network;
  if (!got) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: the vmm-supervisor made its VM without a network (it lacks feature "vmm.network.v1" now?)`);
  if (n.slot >= 0 && got.slot !== n.slot) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: asked the vmm-supervisor for network slot ${n.slot}, got ${got.slot}`);
  n.slot = got.slot;
  n.address = got.address;
  n.gateway = got.gateway;
  n.hostIfname = got.hostIfname;
}

/**
 * stopVmKeepingSlot deletes rec's VM for a stop that comes back on the same disks (drain,
 * ResetRootfs, an interrupted reset finished by adoption): a networked sandbox's slot stays
 * reserved for it (DeleteVm keep_network), so that its next boot gets the same address.
 */
export async function stopVmKeepingSlot(vms: VmPort, rec: SandboxRecord): Promise<void> {
  const vmId = rec.vm?.vmId ?? rec.sandboxId;
  if (rec.network && rec.network.slot >= 0) await vms.delete(vmId, { keepNetwork: true });
  else await vms.delete(vmId);
}

/** States in which a networked sandbox is in the directory (the proxies know it: its VM or slot exists). */
const DIRECTORY_STATES = new Set(['CREATING', 'RUNNING', 'PAUSED', 'DRAINED']);

/** networkView is the directory's view of rec, or undefined when the proxies must not know it. */
export function networkView(rec: SandboxRecord): SandboxNetworkView | undefined {
  const n = rec.network;
  if (!n || n.slot < 0 || !DIRECTORY_STATES.has(rec.state)) return undefined;
  return {
    sandboxId: rec.sandboxId,
    state: rec.state,
    slot: n.slot,
    address: n.address,
    gateway: n.gateway,
    policy: parseEgressPolicy(n.egress),
    public: n.public,
    accessTokenSha256: n.accessTokenSha256,
    poddAddress: rec.poddAddress,
  };
}

/** syncDirectory puts rec's view in the directory, or removes it (no network, DELETING, ERROR, ...). Call after rec is persisted. */
export function syncDirectory(dir: MapNetworkDirectory, rec: SandboxRecord): void {
  const v = networkView(rec);
  if (v) dir.set(v);
  else dir.remove(rec.sandboxId);
}

/** rebuildDirectory makes the directory say what the records say (adoption): views set, others removed. */
export function rebuildDirectory(dir: MapNetworkDirectory, records: SandboxRecord[]): void {
  const keep = new Set<string>();
  for (const r of records) {
    const v = networkView(r);
    if (!v) continue;
    dir.set(v);
    keep.add(r.sandboxId);
  }
  for (const id of dir.sandboxIds()) if (!keep.has(id)) dir.remove(id);
}

/**
 * networkMismatch says how a live VM's network differs from its record ("" when it matches):
 * a networked record whose VM has none, or another slot or address.
 */
export function networkMismatch(rec: SandboxRecord, vm: Pick<VmInfo, 'network'>): string {
  const n = rec.network;
  const got: VmNetworkInfo | undefined = vm.network;
  if (!n || n.slot < 0) return got ? `its VM has network slot ${got.slot} (${got.address}) the record does not name` : '';
  if (!got) return `its record names network slot ${n.slot} (${n.address}), its VM has no network`;
  if (got.slot !== n.slot || got.address !== n.address) return `its record names network slot ${n.slot} (${n.address}), its VM has slot ${got.slot} (${got.address})`;
  return '';
}

/** SlotSweepReport: network slots the orphan sweep released, and what failed. */
export interface SlotSweepReport {
  released: string[];
  failed: string[];
}

/**
 * sweepNetworkSlots releases the reserved or in-use slots whose owner is a sandbox id that no
 * record (and no quarantined row) has. Slots of another kind of owner, spares, and every slot
 * of an owner whose record exists are left alone. A supervisor without network: nothing.
 */
export async function sweepNetworkSlots(d: { store: RecordStore; vms: VmPort; log: Logger }): Promise<SlotSweepReport> {
  const report: SlotSweepReport = { released: [], failed: [] };
  if (!d.vms.releaseNetworkSlot) return report;
  const node = await nodeNetwork(d.vms);
  if (!node.available) return report;
  const owners = new Set([...d.store.list().map((r) => r.sandboxId), ...(d.store.quarantinedIds?.() ?? [])]);
  for (const s of node.slots) {
    if (s.state !== 'RESERVED' && s.state !== 'IN_USE') continue;
    if (!SANDBOX_ID_RE.test(s.owner) || owners.has(s.owner)) continue;
    try {
      if (await d.vms.releaseNetworkSlot(s.slot, s.owner)) report.released.push(`slot ${s.slot} of ${s.owner}`);
    } catch (err) {
      report.failed.push(`network slot ${s.slot} of ${s.owner}: ${(err as Error).message}`);
      d.log.warn({ slot: s.slot, owner: s.owner, err }, 'orphan sweep: could not release a network slot');
    }
  }
  return report;
}

/** AccessTokens derives sandboxes' ingress access tokens from the node key (see the file header). */
export class AccessTokens {
  constructor(private readonly key: Buffer) {
    if (key.length < ACCESS_TOKEN_BYTES) throw new Error(`access token key: ${key.length} bytes, at least ${ACCESS_TOKEN_BYTES}`);
  }

  /** tokenOf is sandbox id's token: 43 base64url characters. */
  tokenOf(sandboxId: string): string {
    return createHmac('sha256', this.key).update(`sandnode-access-token\0${sandboxId}`).digest('base64url');
  }

  /** sha256 is the hex SHA-256 of a token (what records and the directory keep). */
  sha256(token: string): string {
    return createHash('sha256').update(token).digest('hex');
  }

  /** tokenFor is rec's token, or "" without network or when the record's hash is not of this key's token (the key file was replaced). */
  tokenFor(rec: SandboxRecord): string {
    if (!rec.network) return '';
    const t = this.tokenOf(rec.sandboxId);
    return this.sha256(t) === rec.network.accessTokenSha256 ? t : '';
  }
}

/** loadAccessTokenKey reads <stateDir>/access-token.key, making it (32 random bytes, 0600) the first time. */
export function loadAccessTokenKey(stateDir: string): Buffer {
  const file = path.join(stateDir, ACCESS_TOKEN_KEY_FILE);
  if (!existsSync(file)) {
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    try {
      writeFileSync(file, randomBytes(ACCESS_TOKEN_BYTES), { mode: 0o600, flag: 'wx' });
    } catch (err) {
      // another server of the node made it first: use that one
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  const key = readFileSync(file);
  if (key.length !== ACCESS_TOKEN_BYTES) throw new Error(`${file}: ${key.length} bytes, not ${ACCESS_TOKEN_BYTES}; remove it to make a new key (every sandbox's access token changes)`);
  return key;
}
