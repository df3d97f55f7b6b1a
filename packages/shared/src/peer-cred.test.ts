/**
 * Peer credentials (issue 10 §4): SO_PEERCRED through koffi on real unix sockets, and the
 * authMiddleware of createServiceServer that uses them: root passes, an unprivileged uid (a
 * child process run as nobody, 65534) gets PERMISSION_DENIED naming its uid and the handler
 * never runs, a group member passes when the group is allowed, a forged `sandnode-peer`
 * header is ignored; on TCP, no token is UNAUTHENTICATED and a read token doing a change is
 * PERMISSION_DENIED.
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createChannel, createClient, Metadata, Status } from 'nice-grpc';
import { createLogger } from './logger';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { createServiceServer, type ServiceServer } from './server';
import { peerCred } from './peer-cred';
import { PEER_METADATA_KEY, peerKeyOfSocket, UnauthenticatedError, type AuthPolicy } from './connection-auth';

const log = createLogger('test', '0', 'silent');
const NOBODY = 65534;
const isRoot = process.getuid?.() === 0;
const rootIt = isRoot ? it : it.skip;

/** runAs runs node with script as uid/gid (a real unprivileged process); resolves its stdout. */
function runAs(uid: number, gid: number, script: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [script, ...args], { uid, gid, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.on('error', reject);
    p.on('close', (code) => (code === 0 ? resolve(out.trim()) : reject(new Error(`child exited ${code}: ${err}`))));
  });
}

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'peer-cred-'));
  chmodSync(dir, 0o755); // nobody must reach the sockets
  // a raw grpc-js client: calls GetSandbox (empty request) and prints "<code> <details>"
  writeFileSync(
    path.join(dir, 'call.js'),
    `const grpc = require(${JSON.stringify(require.resolve('@grpc/grpc-js'))});
const c = new grpc.Client(process.argv[2], grpc.credentials.createInsecure());
c.makeUnaryRequest('/sandnode.server.v1.SandboxService/GetSandbox', (b) => b, (b) => b, Buffer.alloc(0), (err) => { console.log(err ? err.code + ' ' + err.details : '0 ok'); c.close(); });`,
  );
  writeFileSync(path.join(dir, 'connect.js'), `require('net').connect(process.argv[2]).on('connect', function () { setTimeout(() => this.end(), 200); });`);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('peerCred', () => {
  it('reads pid, uid and gid of the process at the other end of a unix socket', async () => {
    const p = path.join(dir, 'self.sock');
    const srv = net.createServer();
    const got = new Promise<ReturnType<typeof peerCred>>((resolve) => srv.on('connection', (s) => (resolve(peerCred(s)), s.destroy())));
    await new Promise<void>((r) => srv.listen(p, r));
    const c = net.connect(p);
    c.on('error', () => undefined);
    const cred = await got;
    srv.close();
    expect(cred).toEqual(expect.objectContaining({ pid: process.pid, uid: process.getuid!(), gid: process.getgid!() }));
    expect(Array.isArray(cred.groups)).toBe(true);
  });

  rootIt('names an unprivileged process by its uid (a child run as nobody)', async () => {
    const p = path.join(dir, 'nobody.sock');
    const srv = net.createServer();
    const got = new Promise<ReturnType<typeof peerCred>>((resolve) => srv.on('connection', (s) => resolve(peerCred(s))));
    await new Promise<void>((r) => srv.listen(p, r));
    chmodSync(p, 0o666);
    const child = runAs(NOBODY, NOBODY, path.join(dir, 'connect.js'), [p]);
    const cred = await got;
    await child;
    srv.close();
    expect(cred.uid).toBe(NOBODY);
    expect(cred.gid).toBe(NOBODY);
    expect(cred.pid).not.toBe(process.pid);
  });

  rootIt('names the peer of the per-peer connection cap by uid on unix (nobody is not root) and by address on TCP', async () => {
    const p = path.join(dir, 'key.sock');
    const srv = net.createServer();
    const keys: string[] = [];
    const two = new Promise<void>((resolve) => srv.on('connection', (s) => (keys.push(peerKeyOfSocket(s)), keys.length === 2 && resolve())));
    await new Promise<void>((r) => srv.listen(p, r));
    chmodSync(p, 0o666);
    const mine = net.connect(p);
    mine.on('error', () => undefined);
    await runAs(NOBODY, NOBODY, path.join(dir, 'connect.js'), [p]);
    await two;
    mine.destroy();
    srv.close();
    expect(keys.sort()).toEqual([`uid:${NOBODY}`, `uid:${process.getuid!()}`].sort());
    const tcp = net.createServer();
    const key = new Promise<string>((resolve) => tcp.on('connection', (s) => (resolve(peerKeyOfSocket(s)), s.destroy())));
    await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
    const c = net.connect((tcp.address() as net.AddressInfo).port, '127.0.0.1');
    c.on('error', () => undefined);
    expect(await key).toBe('tcp:127.0.0.1');
    tcp.close();
  });

  it('is an Error on a TCP socket (no peer credentials there)', async () => {
    const srv = net.createServer();
    const got = new Promise<unknown>((resolve) =>
      srv.on('connection', (s) => {
        try {
          resolve(peerCred(s));
        } catch (err) {
          resolve(err);
        }
        s.destroy();
      }),
    );
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const c = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
    c.on('error', () => undefined);
    const r = await got;
    srv.close();
    expect(r).toBeInstanceOf(Error);
  });
});

describe('authMiddleware on a unix socket and on TCP', () => {
  let server: ServiceServer;
  let calls = 0;
  let sock: string;
  let port: number;
  const policy: AuthPolicy = {
    verifyToken: (s) => {
      if (s === 'admin-secret') return { name: 'a', role: 'admin' };
      if (s === 'read-secret') return { name: 'r', role: 'read' };
      throw new UnauthenticatedError('unknown token');
    },
  };
  const listeners: net.Server[] = [];

  beforeAll(async () => {
    server = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, auth: policy });
    server.add(SandboxServiceDefinition, {
      getSandbox: () => (calls++, {}),
      deleteSandbox: () => (calls++, {}),
    } as never);
    sock = path.join(dir, 'api.sock');
    const u = net.createServer();
    const t = net.createServer();
    listeners.push(u, t);
    server.serveListener(u);
    server.serveListener(t);
    await new Promise<void>((r) => u.listen(sock, r));
    chmodSync(sock, 0o666); // only the peer-cred check stands between nobody and the service
    await new Promise<void>((r) => t.listen(0, '127.0.0.1', r));
    port = (t.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await server.shutdown(100);
  });

  const client = (addr: string) => createClient(SandboxServiceDefinition, createChannel(addr));
  const code = async (p: Promise<unknown>) =>
    p.then(
      () => Status.OK,
      (e: { code?: Status; details?: string }) => e.code,
    );

  rootIt('root on the unix socket is served', async () => {
    const before = calls;
    await client(`unix://${sock}`).getSandbox({ sandboxId: 'x' });
    expect(calls).toBe(before + 1);
  });

  rootIt('an unprivileged uid (nobody) gets PERMISSION_DENIED naming its uid, and the handler never runs; root is served meanwhile', async () => {
    const before = calls;
    const out = await runAs(NOBODY, NOBODY, path.join(dir, 'call.js'), [`unix://${sock}`]);
    expect(out).toMatch(new RegExp(`^${Status.PERMISSION_DENIED} .*uid ${NOBODY}`));
    expect(calls).toBe(before);
    await client(`unix://${sock}`).getSandbox({ sandboxId: 'x' });
    expect(calls).toBe(before + 1);
  });

  rootIt('a member of an allowed group is served', async () => {
    const s2 = createServiceServer({ info: { component: 'test', version: '0.0.0', commit: '', features: [] }, log, auth: { unixGroups: [NOBODY] } });
    let n = 0;
    s2.add(SandboxServiceDefinition, { getSandbox: () => (n++, {}) } as never);
    const l = net.createServer();
    s2.serveListener(l);
    const p2 = path.join(dir, 'group.sock');
    await new Promise<void>((r) => l.listen(p2, r));
    chmodSync(p2, 0o666);
    const out = await runAs(NOBODY, NOBODY, path.join(dir, 'call.js'), [`unix://${p2}`]);
    await s2.shutdown(100);
    expect(out).toBe('0 ok');
    expect(n).toBe(1);
  });

  it('a forged sandnode-peer header does not make a TCP caller root', async () => {
    const forged = new Metadata().set(PEER_METADATA_KEY, JSON.stringify({ transport: 'unix', uid: 0, gid: 0, groups: [], pid: 1 }));
    expect(await code(client(`127.0.0.1:${port}`).getSandbox({ sandboxId: 'x' }, { metadata: forged }))).toBe(Status.UNAUTHENTICATED);
  });

  it('TCP: no token is UNAUTHENTICATED, a wrong one too, a read token may read but not change, an admin token may change', async () => {
    const c = client(`127.0.0.1:${port}`);
    const bearer = (s: string) => ({ metadata: new Metadata().set('authorization', `Bearer ${s}`) });
    const before = calls;
    expect(await code(c.getSandbox({ sandboxId: 'x' }))).toBe(Status.UNAUTHENTICATED);
    expect(await code(c.getSandbox({ sandboxId: 'x' }, bearer('nope')))).toBe(Status.UNAUTHENTICATED);
    expect(await code(c.getSandbox({ sandboxId: 'x' }, { metadata: new Metadata().set('authorization', 'Basic abc') }))).toBe(Status.UNAUTHENTICATED);
    expect(await code(c.deleteSandbox({ sandboxId: 'x' }, bearer('read-secret')))).toBe(Status.PERMISSION_DENIED);
    expect(calls).toBe(before);
    expect(await code(c.getSandbox({ sandboxId: 'x' }, bearer('read-secret')))).toBe(Status.OK);
    expect(await code(c.deleteSandbox({ sandboxId: 'x' }, bearer('admin-secret')))).toBe(Status.OK);
    expect(calls).toBe(before + 2);
  });
});
