/**
 * Sandbox networking in the CLI (docs/network.md): the create/fork flags that make a
 * CreateSandboxRequest.network, `sandbox network ID [...]` (UpdateSandboxNetwork; without
 * flags it shows the network) and `sandbox url ID PORT` (the ingress URL and the header to send).
 */
import type { Command } from 'commander';
import type { SandboxNetworkRequest } from '@sandnode/shared/proto/server/v1/sandbox';
import { sandboxJson } from '@sandnode/node-stack';
import { dirsOf } from '../options';
import { CliError, UsageError, action, print } from '../output';
import { withServer } from '../server-calls';

/** The header a private sandbox's ingress needs. */
export const ACCESS_TOKEN_HEADER = 'sandnode-access-token';

/** The network flags of `sandbox create` (commander: --no-network makes network false). */
export interface NetworkFlags {
  allowOut: string[];
  denyOut: string[];
  blockAll?: boolean;
  public?: boolean;
  /** false with --no-network */
  network?: boolean;
}

/** The help of --allow-out: alone it allows nothing more, since everything but the always-denied ranges is allowed by default (network.proto). */
const ALLOW_OUT_HELP =
  'allowed destination: address, CIDR, domain or *.domain (repeatable); everything outside the always-denied ranges (private, link-local, loopback) is allowed by default, so it matters with --block-all or to lift a --deny-out';

/** collect is commander's parser of a repeatable option: each value appended. */
export function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** addNetworkFlags gives a create (or fork) command --allow-out, --deny-out (repeatable), --block-all, --no-network and --public. */
export function addNetworkFlags(cmd: Command): Command {
  return cmd
    .option('--allow-out <dest>', ALLOW_OUT_HELP, collect, [])
    .option('--deny-out <dest>', 'refused destination: address or CIDR (repeatable)', collect, [])
    .option('--block-all', 'refuse every destination --allow-out does not allow')
    .option('--public', 'ingress without the access token')
    .option('--no-network', 'no network (loopback only)');
}

/**
 * networkRequest is the CreateSandboxRequest.network the flags ask for: undefined when none is
 * given (the node's default: a network where the node has one). UsageError for --no-network
 * with a policy flag or --public.
 */
export function networkRequest(f: NetworkFlags): SandboxNetworkRequest | undefined {
  const policy = f.allowOut.length > 0 || f.denyOut.length > 0 || !!f.blockAll;
  if (f.network === false) {
    if (policy || f.public) throw new UsageError('--no-network cannot go with --allow-out, --deny-out, --block-all or --public');
    return { disabled: true, egress: undefined, public: false };
  }
  if (!policy && !f.public) return undefined;
  return { disabled: false, egress: policy ? { allowOut: f.allowOut, denyOut: f.denyOut, blockAll: !!f.blockAll } : undefined, public: !!f.public };
}

/**
 * tokenText is what `create` prints of a new sandbox's access token (it is shown only once); a
 * public sandbox's ingress needs none, so its token is said to be for when it turns private.
 */
export function tokenText(token: string, repeat = false, isPublic = false): string {
  if (!token) return '';
  const use = isPublic
    ? `not needed while the sandbox is public; send it as header ${ACCESS_TOKEN_HEADER}: once \`sandbox network ID --private\` makes it private`
    : `send it as header ${ACCESS_TOKEN_HEADER}: for its ingress`;
  // a repeat by request_id derives the first answer's token again (CreateSandboxResponse.access_token)
  if (repeat) return `access token ${token} (the one the first create gave; ${use})`;
  return `access token ${token} (shown only now; ${use})`;
}

/**
 * networkLine is the line `create`/`fork` print of a new sandbox's network: its address and
 * ingress URL, or that it has none (a node whose network is off makes sandboxes without one when
 * no network flag is given: `sandbox create --allow-out ...` says why).
 */
export function networkLine(n: ReturnType<typeof sandboxJson>['network']): string {
  if (!n) return 'no network (loopback only)';
  return `network ${n.address ?? ''} (gateway ${n.gateway ?? ''}), ingress ${n.ingressUrl ?? 'off'}${n.public ? ' (public)' : ''}`;
}

/**
 * urlOf fills the port (text, 1..65535) into an ingress_url. UsageError (exit 2) for a bad port;
 * CliError (exit 1: the command line is right, the sandbox has none) for a sandbox without one.
 */
export function urlOf(id: string, ingressUrl: string | undefined, portText: string): string {
  const port = Number(portText);
  if (!/^\d{1,5}$/.test(portText) || port < 1 || port > 65535) throw new UsageError(`port: ${JSON.stringify(portText)} is not 1..65535`);
  if (!ingressUrl) throw new CliError(`sandbox ${id} has no ingress URL (no network, or the server has no ingress listener: config ingressListen)`);
  return ingressUrl.replace('{port}', String(port));
}

/**
 * headerForm is the same target for a client that cannot resolve `*.localhost` (glibc's resolver,
 * so Node's fetch, wget, most libraries; curl and browsers can): the listener on 127.0.0.1 with
 * the routing headers. undefined when the URL is not under `.localhost` (its names resolve).
 */
export function headerForm(id: string, url: string, port: number): { url: string; headers: Record<string, string> } | undefined {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return undefined;
  }
  if (!u.hostname.endsWith('.localhost')) return undefined;
  return { url: `${u.protocol}//127.0.0.1${u.port ? `:${u.port}` : ''}/`, headers: { 'sandnode-sandbox-id': id, 'sandnode-sandbox-port': String(port) } };
}

/** registerNetworkCommands adds `sandbox network` and `sandbox url` to the sandbox command. */
export function registerNetworkCommands(sandbox: Command): void {
  sandbox
    .command('network <id>')
    .description(
      "show a sandbox's network, or change it: policy flags set a new egress policy (it replaces the old whole); --public or --private alone changes only who may reach the ingress (the policy stays)",
    )
    .option('--allow-out <dest>', ALLOW_OUT_HELP, collect, [])
    .option('--deny-out <dest>', 'refused destination: address or CIDR (repeatable)', collect, [])
    .option('--block-all', 'refuse every destination --allow-out does not allow')
    .option('--public', 'ingress without the access token')
    .option('--private', 'ingress needs the access token')
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, o: NetworkFlags & { private?: boolean; json?: boolean }, cmd: Command) => {
        const change = networkChange(o);
        const note = allowOutNote(o);
        if (note && !o.json) process.stderr.write(note);
        const s = await withServer(dirsOf(cmd), async (api) => {
          const now = (await api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
          if (!change) return now;
          // only --public/--private: the policy in force stays
          const egress = change.egress ?? now.network?.egress ?? { allowOut: [], denyOut: [], blockAll: false };
          return (await api.sandboxes.updateSandboxNetwork({ sandboxId: id, egress, public: change.public })).sandbox!;
        });
        const j = sandboxJson(s);
        print(!!o.json, j.network, () => networkText(j.network));
      }),
    );

  sandbox
    .command('url <id> <port>')
    .description("print the ingress URL of a sandbox's port and the header a private sandbox needs")
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, portText: string, o: { json?: boolean }, cmd: Command) => {
        const s = (await withServer(dirsOf(cmd), (api) => api.sandboxes.getSandbox({ sandboxId: id }))).sandbox!;
        const url = urlOf(id, s.network?.ingressUrl, portText);
        const isPublic = !!s.network?.public;
        const direct = headerForm(id, url, Number(portText));
        const out = { url, public: isPublic, header: isPublic ? '' : ACCESS_TOKEN_HEADER, ...(direct ? { headerForm: direct } : {}) };
        print(!!o.json, out, () =>
          [
            url,
            ...(isPublic ? [] : [`header ${ACCESS_TOKEN_HEADER}: <the access token \`sandbox create\` printed>`]),
            ...(direct
              ? [
                  `without a *.localhost resolver (Node fetch, wget): ${direct.url} with headers ${Object.entries(direct.headers)
                    .map(([k, v]) => `${k}: ${v}`)
                    .join(', ')}`,
                ]
              : []),
          ].join('\n'),
        );
      }),
    );
}

/**
 * allowOutNote: the note for --allow-out given without --block-all or a --deny-out it could lift
 * (allow wins over deny): every destination that is not always denied is allowed already, so the
 * flag changes nothing (newcomer: accepted silently). undefined when it does something.
 */
export function allowOutNote(f: Pick<NetworkFlags, 'allowOut' | 'denyOut' | 'blockAll'>): string | undefined {
  if (f.allowOut.length === 0 || f.blockAll || f.denyOut.length > 0) return undefined;
  return 'sandnode: note: --allow-out changes nothing without --block-all or a --deny-out it lifts: every destination not always denied is allowed already\n';
}

/** networkChange is what `sandbox network` flags change: undefined without flags (show). UsageError for --public with --private. */
export function networkChange(o: NetworkFlags & { private?: boolean }): { egress?: { allowOut: string[]; denyOut: string[]; blockAll: boolean }; public?: boolean } | undefined {
  if (o.public && o.private) throw new UsageError('give one of --public and --private');
  const policy = o.allowOut.length > 0 || o.denyOut.length > 0 || !!o.blockAll;
  const pub = o.public ? true : o.private ? false : undefined;
  if (!policy && pub === undefined) return undefined;
  return { ...(policy ? { egress: { allowOut: o.allowOut, denyOut: o.denyOut, blockAll: !!o.blockAll } } : {}), public: pub };
}

/** networkText shows a sandbox's network in lines (or that it has none). */
export function networkText(n: ReturnType<typeof sandboxJson>['network']): string {
  if (!n) return 'no network';
  const e = n.egress ?? {};
  return [
    `slot          ${n.slot ?? 0}`,
    `address       ${n.address ?? ''}`,
    `gateway       ${n.gateway ?? ''}`,
    `allow out     ${(e.allowOut ?? []).join(' ') || '-'}`,
    `deny out      ${(e.denyOut ?? []).join(' ') || '-'}`,
    `block all     ${e.blockAll ? 'yes' : 'no'}`,
    `ingress       ${n.public ? 'public' : 'private (header sandnode-access-token)'}`,
    `ingress url   ${n.ingressUrl ?? '-'}`,
  ].join('\n');
}
