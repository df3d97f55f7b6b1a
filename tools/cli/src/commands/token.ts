/**
 * `sandnode token create --name N [--role admin|read] [--ttl-ms MS] | list | revoke NAME|ID`:
 * the bearer tokens of the public API's TCP listener (AdminService on the active server's admin
 * socket, root only). `create` prints the secret once (the server keeps only its sha256);
 * callers send it as `authorization: Bearer <secret>` (CLI: `--token` or SANDNODE_TOKEN).
 */
import { Option, type Command } from 'commander';
import { table, waitForActiveServer } from '@sandnode/node-stack';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { AdminServiceDefinition, TokenRole, type ApiToken } from '@sandnode/shared/proto/server/v1/admin';
import { dirsOf, wholeNumber } from '../options';
import { requireLocal } from '../local-only';
import { action, print } from '../output';

type Admin = ReturnType<typeof createServiceClient<typeof AdminServiceDefinition>>;

/** withAdmin runs fn with the active server's AdminService (its admin socket), then closes the connection. */
async function withAdmin<T>(cmd: Command, fn: (admin: Admin) => Promise<T>): Promise<T> {
  requireLocal(cmd, `token ${cmd.name()}`);
  const holder = await waitForActiveServer(dirsOf(cmd).runDir);
  const ch = createSandnodeChannel(holder.admin);
  try {
    return await fn(createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 30_000 }));
  } finally {
    ch.close();
  }
}

const iso = (ms: number) => (ms ? new Date(ms).toISOString() : '-');
const roleName = (r: TokenRole) => (r === TokenRole.TOKEN_ROLE_ADMIN ? 'admin' : r === TokenRole.TOKEN_ROLE_READ ? 'read' : 'unspecified');
const view = (t: ApiToken) => ({ id: t.id, name: t.name, role: roleName(t.role), createdAtMs: t.createdAtMs, expiresAtMs: t.expiresAtMs, revokedAtMs: t.revokedAtMs });
const state = (t: ApiToken) => (t.revokedAtMs ? 'revoked' : t.expiresAtMs && t.expiresAtMs <= Date.now() ? 'expired' : 'live');

/** registerTokenCommands adds `token create | list | revoke` to program. */
export function registerTokenCommands(program: Command): void {
  const token = program
    .command('token')
    .description('bearer tokens of the TCP API (on the admin socket: root only)')
    .addHelpText('after', "\nToken commands are local only: they talk to the active server's admin socket on this node (root only), never to --address; --address is refused.");
  token
    .command('create')
    .description('make a token and print its secret (shown only once)')
    .requiredOption('--name <name>', 'token name (1..64 of [A-Za-z0-9._-])')
    .addOption(new Option('--role <role>', 'admin: every call; read: only calls without side effects').choices(['admin', 'read']).default('admin'))
    .option('--ttl-ms <ms>', 'lifetime, ms (0: never expires)', wholeNumber, 0)
    .option('--json', 'print JSON')
    .action(
      action(async (o: { name: string; role: 'admin' | 'read'; ttlMs: number; json?: boolean }, cmd: Command) => {
        const r = await withAdmin(cmd, (a) => a.createToken({ name: o.name, role: o.role === 'admin' ? TokenRole.TOKEN_ROLE_ADMIN : TokenRole.TOKEN_ROLE_READ, ttlMs: o.ttlMs }));
        const t = view(r.token!);
        print(!!o.json, { ...t, secret: r.secret }, () => `token ${t.name} (${t.id}, ${t.role}, expires ${iso(t.expiresAtMs)})\nsecret (shown only now): ${r.secret}`);
      }),
    );
  token
    .command('list')
    .description('list the tokens (never a secret)')
    .option('--json', 'print JSON')
    .action(
      action(async (o: { json?: boolean }, cmd: Command) => {
        const r = await withAdmin(cmd, (a) => a.listTokens({}));
        print(!!o.json, { tokens: r.tokens.map((t) => ({ ...view(t), state: state(t) })) }, () =>
          table(
            ['NAME', 'ID', 'ROLE', 'STATE', 'CREATED', 'EXPIRES'],
            r.tokens.map((t) => [t.name, t.id, roleName(t.role), state(t), iso(t.createdAtMs), iso(t.expiresAtMs)]),
          ),
        );
      }),
    );
  token
    .command('revoke')
    .description('revoke a token by name or id: its next call is UNAUTHENTICATED')
    .argument('<name-or-id>')
    .option('--json', 'print JSON')
    .action(
      action(async (nameOrId: string, o: { json?: boolean }, cmd: Command) => {
        // the admin socket is on this node (token commands are local only): the server's clock is this one,
        // so a revocation time before the call means the token was revoked already
        const before = Date.now();
        const r = await withAdmin(cmd, (a) => a.revokeToken({ nameOrId }));
        const t = view(r.token!);
        const already = t.revokedAtMs < before;
        print(!!o.json, { ...t, alreadyRevoked: already }, () =>
          already ? `token ${t.name} (${t.id}) already revoked at ${iso(t.revokedAtMs)}` : `revoked token ${t.name} (${t.id}) at ${iso(t.revokedAtMs)}`,
        );
      }),
    );
}
