/**
 * Credentials on the server's TCP listener (issue 10 §4), real processes, through a handover:
 *
 * - plaintext on loopback: a call without a token is UNAUTHENTICATED, a read token's
 *   CreateSandbox is PERMISSION_DENIED and makes nothing, a token revoked with `sandnode token
 *   revoke` fails on the very next call of an open connection; the CLI's --token works;
 * - mutual TLS: no client certificate, one of another CA, or plaintext are refused; the
 *   `sandnode certs init` client pair is served;
 * - after `upgradeServer` (the next server adopts the listening sockets and reads the TLS files
 *   and the tokens from the node's settings file and records.db) all of the above still holds
 *   for fresh connections, and the unix socket still answers root and refuses uid 65534.
 */
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connectServerApi, socketPath, unixAddress, type ClientAuth } from '@sandnode/shared';
import { upgradeServer } from '@sandnode/node-stack';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';
import { Status } from 'nice-grpc-common';

jest.setTimeout(300_000);

const NOBODY = 65534;
const CLI = require.resolve('@sandnode/cli/dist/main.js');

/** code answers the status of one ListSandboxes (or CreateSandbox) on a fresh connection to address with auth. */
async function code(address: string, auth: ClientAuth, what: 'list' | 'create' = 'list'): Promise<Status> {
  const api = connectServerApi(address, 10_000, auth);
  try {
    if (what === 'list') await api.sandboxes.listSandboxes({}, { retry: false });
    else await api.sandboxes.createSandbox({ template: 'base' }, { retry: false });
    return Status.OK;
  } catch (err) {
    return (err as { code?: Status }).code ?? Status.UNKNOWN;
  } finally {
    api.close();
  }
}

function tokenOf(node: TestNode, name: string, role: 'admin' | 'read'): string {
  const r = node.cli(['token', 'create', '--name', name, '--role', role, '--json']);
  if (r.status !== 0) throw new Error(`token create: ${r.stderr}`);
  return (JSON.parse(r.stdout) as { secret: string }).secret;
}

/** unixAsNobody: the status code uid 65534 gets from ListSandboxes on the unix socket when its mode (0666 for the test) lets it connect. */
async function unixAsNobody(node: TestNode, dir: string): Promise<string> {
  const sock = socketPath(node.dirs.runDir, 'server');
  for (const d of [path.dirname(node.dirs.runDir), node.dirs.runDir, dir]) chmodSync(d, 0o755);
  const script = path.join(dir, 'call.js');
  writeFileSync(
    script,
    `const grpc = require(${JSON.stringify(require.resolve('@grpc/grpc-js'))});
const c = new grpc.Client(process.argv[2], grpc.credentials.createInsecure());
c.makeUnaryRequest('/sandnode.server.v1.SandboxService/ListSandboxes', (b) => b, (b) => b, Buffer.alloc(0), { deadline: Date.now() + 20000 }, (err) => { console.log(err ? err.code + ' ' + err.details : '0 ok'); c.close(); });`,
  );
  chmodSync(sock, 0o666);
  try {
    return await new Promise<string>((resolve, reject) => {
      const p = spawn(process.execPath, [script, unixAddress(sock)], { uid: NOBODY, gid: NOBODY, stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      p.stdout.on('data', (d: Buffer) => (out += d.toString()));
      p.on('error', reject);
      p.on('close', () => resolve(out.trim()));
    });
  } finally {
    chmodSync(sock, 0o600);
  }
}

describeNode('TCP on loopback, plaintext: bearer tokens', () => {
  let node: TestNode;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-tcp-auth-'));
    node = await startNode({ listen: '127.0.0.1:0', buildTemplate: false });
  });
  afterAll(async () => {
    await node?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('no token: UNAUTHENTICATED; a read token reads but its CreateSandbox is PERMISSION_DENIED; a revoked token fails on its next call; all of it after a handover too', async () => {
    const tcp = node.tcpAddress();
    const admin = node.tcpToken();
    const read = tokenOf(node, 'reader', 'read');
    const victim = tokenOf(node, 'victim', 'admin');
    const count = async () => (await node.api.sandboxes.listSandboxes({})).sandboxes.length;
    const before = await count();

    expect(await code(tcp, {})).toBe(Status.UNAUTHENTICATED);
    expect(await code(tcp, { token: 'sn_not-a-token' })).toBe(Status.UNAUTHENTICATED);
    expect(await code(tcp, { token: read })).toBe(Status.OK);
    expect(await code(tcp, { token: read }, 'create')).toBe(Status.PERMISSION_DENIED);
    expect(await count()).toBe(before);
    expect(await code(tcp, { token: admin })).toBe(Status.OK);

    // revocation holds on the next call of a connection that is already open
    const open = connectServerApi(tcp, 10_000, { token: victim });
    try {
      await open.sandboxes.listSandboxes({}, { retry: false });
      expect(node.cli(['token', 'revoke', 'victim']).status).toBe(0);
      await expect(open.sandboxes.listSandboxes({}, { retry: false })).rejects.toMatchObject({ code: Status.UNAUTHENTICATED });
    } finally {
      open.close();
    }
    const listed = JSON.parse(node.cli(['token', 'list', '--json']).stdout) as { tokens: { name: string; state: string }[] };
    expect(listed.tokens.map((t) => `${t.name}:${t.state}`).sort()).toEqual(['reader:live', 'testkit:live', 'victim:revoked']);

    // the CLI on --address host:port: with --token it works, without it says UNAUTHENTICATED
    const cli = (args: string[]) => spawnSync(process.execPath, [CLI, '--address', tcp, ...args], { encoding: 'utf8', timeout: 60_000 });
    expect(cli(['--token', admin, 'sandbox', 'list', '--json']).status).toBe(0);
    const bare = cli(['sandbox', 'list']);
    expect(bare.status).toBe(1);
    expect(bare.stderr).toMatch(/UNAUTHENTICATED/);

    await upgradeServer(node.dirs, '.');
    expect(node.tcpAddress()).toBe(tcp);
    expect(await code(tcp, {})).toBe(Status.UNAUTHENTICATED);
    expect(await code(tcp, { token: victim })).toBe(Status.UNAUTHENTICATED);
    expect(await code(tcp, { token: read }, 'create')).toBe(Status.PERMISSION_DENIED);
    expect(await code(tcp, { token: admin })).toBe(Status.OK);
    node.reconnect();
    expect(await count()).toBe(before); // root on the unix socket
    expect(await unixAsNobody(node, dir)).toMatch(new RegExp(`^${Status.PERMISSION_DENIED} .*uid ${NOBODY}`));
  });
});

describeNode('TCP with mutual TLS', () => {
  let node: TestNode;
  let dir: string;
  const certs = (d: string) => ({ ca: path.join(d, 'ca.pem'), cert: path.join(d, 'client.pem'), key: path.join(d, 'client.key') });
  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-tls-auth-'));
    for (const d of ['ours', 'theirs']) {
      const r = spawnSync(process.execPath, [CLI, 'certs', 'init', '--dir', path.join(dir, d)], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`certs init: ${r.stderr}`);
    }
    const d = path.join(dir, 'ours');
    node = await startNode({
      listen: '127.0.0.1:0',
      buildTemplate: false,
      env: { server: { SANDNODE_SERVER_TLS_CA: path.join(d, 'ca.pem'), SANDNODE_SERVER_TLS_CERT: path.join(d, 'server.pem'), SANDNODE_SERVER_TLS_KEY: path.join(d, 'server.key') } },
    });
  });
  afterAll(async () => {
    await node?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('refuses no certificate, a certificate of another CA and plaintext; serves the client pair; the same after a handover', async () => {
    const tcp = node.tcpAddress();
    const ours = certs(path.join(dir, 'ours'));
    const theirs = certs(path.join(dir, 'theirs'));
    const good: ClientAuth = { tlsCa: ours.ca, tlsCert: ours.cert, tlsKey: ours.key };
    const check = async () => {
      expect(await code(tcp, { tlsCa: ours.ca })).toBe(Status.UNAVAILABLE);
      expect(await code(tcp, { tlsCa: ours.ca, tlsCert: theirs.cert, tlsKey: theirs.key })).toBe(Status.UNAVAILABLE);
      expect(await code(tcp, { token: node.tcpToken() })).toBe(Status.UNAVAILABLE); // plaintext to a TLS port
      expect(await code(tcp, good)).toBe(Status.OK);
    };
    await check();
    const read = tokenOf(node, 'tls-reader', 'read');
    expect(await code(tcp, { ...good, token: read }, 'create')).toBe(Status.PERMISSION_DENIED);
    await upgradeServer(node.dirs, '.');
    expect(node.tcpAddress()).toBe(tcp);
    await check();
    expect(await code(tcp, { ...good, token: read }, 'create')).toBe(Status.PERMISSION_DENIED);
  });
});
