/**
 * The public API of a node's server (`sandnode.server.v1` SandboxService and TemplateService)
 * on one channel: what the operator CLI, the benchmark and the compat tests talk to.
 */
import type { Channel } from 'nice-grpc';
import { createSandnodeChannel, createServiceClient, type ServiceClient } from './client';
import type { ClientAuth } from './client-auth';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { TemplateServiceDefinition } from './gen/sandnode/server/v1/template';
import { VersionServiceDefinition } from './gen/sandnode/common/v1/version';

export interface ServerApi {
  channel: Channel;
  /** the address it was opened at ("unix:///abs.sock" or "host:port"); the bulk channel needs a unix one */
  address?: string;
  sandboxes: ServiceClient<typeof SandboxServiceDefinition>;
  templates: ServiceClient<typeof TemplateServiceDefinition>;
  /** the server's GetVersion (its version and features), on the same channel and token */
  version: ServiceClient<typeof VersionServiceDefinition>;
  close(): void;
}

/**
 * connectServerApi opens the server API at address ("unix:///abs.sock" or "host:port"); unary
 * calls get a deadline of timeoutMs, streams none. auth: TLS files and a bearer token for a TCP
 * listener (client-auth.ts).
 */
export function connectServerApi(address: string, timeoutMs = 120_000, auth: ClientAuth = {}): ServerApi {
  const channel = createSandnodeChannel(address, auth);
  return {
    channel,
    address,
    sandboxes: createServiceClient(SandboxServiceDefinition, channel, { timeoutMs, token: auth.token }),
    templates: createServiceClient(TemplateServiceDefinition, channel, { timeoutMs, token: auth.token }),
    version: createServiceClient(VersionServiceDefinition, channel, { timeoutMs, token: auth.token }),
    close: () => channel.close(),
  };
}

/**
 * What a takeover reports: the line a new server prints on stdout when it serves after a
 * handover, read by `sandnode upgrade server` (node-stack). Times in ms.
 */
export interface TakeoverResult {
  takeover: true;
  oldPid: number;
  oldVersion: string;
  newPid: number;
  newVersion: string;
  epoch: number;
  holdWindowMs: number;
  /** users' sandboxes adopted (warm-pool members are in poolMembersAdopted) */
  adopted: number;
  adoptionMs: number;
  listeners: string[];
  /** warm-pool members adopted; absent from a 0.3.0-dev line that counted them in adopted */
  poolMembersAdopted?: number;
}

/** adminSocketName is a server's admin socket file in the run dir: `server-<slot or pid>-admin.sock`. */
export function adminSocketName(slotOrPid: string): string {
  return `server-${slotOrPid}-admin.sock`;
}

/** ADMIN_SOCKET_RE matches the file names {@link adminSocketName} makes. */
export const ADMIN_SOCKET_RE = /^server-[A-Za-z0-9]+-admin\.sock$/;
