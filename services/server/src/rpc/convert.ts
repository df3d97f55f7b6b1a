/**
 * Conversions between the public proto messages (server.v1) and the domain types.
 */
import { isHibernated, nextIdleAction } from '../core/idle';
import { ForkMethod as PbForkMethod, type IdleStatus, type Sandbox, type SandboxNetwork, type SandboxState as PbState } from '@sandnode/shared/proto/server/v1/sandbox';
import type { ForkMethod } from '../core/sandbox-manager';
import type { Template } from '@sandnode/shared/proto/server/v1/template';
import { DrainOutcome, type DrainedSandbox, type DrainResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { DrainReport } from '../core/drain';
import type { SandboxRecord, SandboxState, TemplateInfo } from '../core/types';
import { stateFromPb, stateToPb } from '../store/record-codec';

/** Where the server's ingress listener is (config ingressListen / ingressDomain), for Sandbox.network.ingress_url. */
export interface IngressAddress {
  /** "host:port"; "" when there is no ingress listener */
  listen: string;
  /** the domain of `<port>-<id>.<domain>` */
  domain: string;
}

/** No ingress listener: ingress_url stays empty. */
export const NO_INGRESS: IngressAddress = { listen: '', domain: '' };

/** ingressUrl is the sandbox's ingress URL with "{port}" for the port ("http://{port}-sb-….localhost:8480"), "" without a listener. */
export function ingressUrl(sandboxId: string, ingress: IngressAddress): string {
  if (!ingress.listen) return '';
  const port = ingress.listen.slice(ingress.listen.lastIndexOf(':') + 1);
  return `http://{port}-${sandboxId}.${ingress.domain}${port === '80' ? '' : `:${port}`}`;
}

/** networkToPb is the public view of a record's network; undefined without one. */
function networkToPb(r: SandboxRecord, ingress: IngressAddress): SandboxNetwork | undefined {
  const n = r.network;
  if (!n) return undefined;
  return {
    slot: n.slot,
    address: n.address,
    gateway: n.gateway,
    egress: { allowOut: [...n.egress.allowOut], denyOut: [...n.egress.denyOut], blockAll: n.egress.blockAll },
    public: n.public,
    ingressUrl: ingressUrl(r.sandboxId, ingress),
  };
}

/** idleToPb is the public view of a record's idle part (lastActivityMs: the server's newest, epoch ms); undefined without one. */
function idleToPb(r: SandboxRecord, lastActivityMs: number): IdleStatus | undefined {
  const i = r.idle;
  if (!i) return undefined;
  const next = nextIdleAction(r, Math.max(lastActivityMs, i.lastActivityMs));
  return {
    settings: { ...i.settings },
    lastActivityMs: Math.max(lastActivityMs, i.lastActivityMs),
    keepAliveUntilMs: i.keepAliveUntilMs,
    nextAction: next?.action ?? '',
    nextActionAtMs: next?.atMs ?? 0,
    pausedAtMs: i.pausedAtMs,
    hibernated: isHibernated(r),
  };
}

/**
 * sandboxToPb gives the public view of a record (ingress: where the ingress listener is, for
 * network.ingress_url; lastActivityMs: the in-memory last activity, epoch ms, for idle).
 */
export function sandboxToPb(r: SandboxRecord, ingress: IngressAddress = NO_INGRESS, lastActivityMs = 0): Sandbox {
  return {
    sandboxId: r.sandboxId,
    state: stateToPb(r.state),
    template: r.template,
    // a drained sandbox has no process until it is resumed (then a new pid)
    pid: r.state === 'DRAINED' ? 0 : (r.vm?.pid ?? 0),
    metadata: { ...r.metadata },
    resources: { ...r.resources },
    createdAtMs: r.createdAtMs,
    expiresAtMs: r.expiresAtMs,
    poddVersion: r.templatePoddVersion,
    errorMessage: r.errorMessage,
    rootfsGeneration: r.rootfsGeneration || 1,
    forkedFrom: r.forkedFrom,
    // what the supervisor applied at the current VM's create; a drained sandbox has no VM
    isolation: r.state === 'DRAINED' || !r.vm ? [] : [...(r.vm.isolation ?? [])],
    network: networkToPb(r, ingress),
    idle: idleToPb(r, lastActivityMs),
    envKeys: Object.keys(r.env ?? {}).sort(),
  };
}

/** forkMethodToPb maps how a fork held its parent; a repeated request_id says UNSPECIFIED. */
export function forkMethodToPb(m: ForkMethod): PbForkMethod {
  switch (m) {
    case 'quiesce':
      return PbForkMethod.FORK_METHOD_QUIESCE;
    case 'pause':
      return PbForkMethod.FORK_METHOD_PAUSE;
    case 'paused-parent':
      return PbForkMethod.FORK_METHOD_PAUSED_PARENT;
    case 'existing':
      return PbForkMethod.FORK_METHOD_UNSPECIFIED;
  }
}

/** statesFromPb maps a filter list; unknown enum values match nothing. */
export function statesFromPb(states: (PbState | number)[]): SandboxState[] {
  return states.map((s) => stateFromPb(s));
}

/** templateToPb gives the public view of a template. */
export function templateToPb(t: TemplateInfo): Template {
  return { name: t.name, poddVersion: t.poddVersion, rootfsPath: t.rootfsPath, sizeBytes: t.sizeBytes, createdAtMs: t.createdAtMs, buildMs: t.buildMs };
}

/** drainedToPb gives one sandbox's outcome of a drain (DrainResponse.sandboxes, DrainStreamResponse.sandbox). */
export function drainedToPb(s: DrainReport['sandboxes'][number]): DrainedSandbox {
  return {
    sandboxId: s.sandboxId,
    outcome: s.outcome === 'preserved' ? DrainOutcome.DRAIN_OUTCOME_PRESERVED : DrainOutcome.DRAIN_OUTCOME_FAILED,
    resumeMethod: s.resumeMethod,
    error: s.error,
    ms: s.ms,
  };
}

/** drainReportToPb gives AdminService.Drain's answer for a drain's report (core/drain.ts). */
export function drainReportToPb(r: DrainReport): DrainResponse {
  return {
    sandboxes: r.sandboxes.map(drainedToPb),
    durationMs: r.durationMs,
    deviceManagerStopped: r.deviceManagerStopped,
    deviceManagerError: r.deviceManagerError,
  };
}
