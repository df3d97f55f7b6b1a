/**
 * The server's bulk channel on real unix sockets: a token is taken once, only by the uid and
 * pid it was issued to, and not after it expired; a good one gets an fd connected to the
 * sandbox's podd socket, which was sent the request the token stands for.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { BULK_MAGIC, readLine, Status, type PoddBulkRequest } from '@sandnode/shared';
import type { SandboxManager } from '../core/sandbox-manager';
import { BulkChannel, MAX_BULK_CONNECTIONS_PER_UID, MAX_BULK_TOKENS_PER_UID } from './bulk-transfer';
import { usocket } from '../__tests__/usock';

let tmp: string;
let servers: net.Server[];
beforeEach(() => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bulk-'));
  servers = [];
});
afterEach(() => {
  for (const s of servers) s.close();
  rmSync(tmp, { recursive: true, force: true });
});

const REQ: PoddBulkRequest = { op: 'download', path: '/workspace/f', offset: 0, beneath: '/workspace' };
const me = { uid: process.getuid!(), pid: process.pid };

/** node starts a bulk server socket and a fake podd socket (which records the first line after the magic and answers "hi"). */
async function node(bulk: BulkChannel): Promise<{ sock: string; podd: string[] }> {
  const podd: string[] = [];
  const poddPath = path.join(tmp, 'podd.sock');
  const p = net.createServer((s) => {
    s.pause();
    void (async () => {
      expect(await readLine(s)).toBe('SNBULK1');
      return readLine(s);
    })().then((l) => {
      podd.push(l);
      s.end('hi');
    });
  });
  await new Promise<void>((r) => p.listen(poddPath, r));
  bulk.manager = { get: () => ({ state: 'RUNNING', poddAddress: `unix://${poddPath}` }) } as unknown as SandboxManager;
  const sock = path.join(tmp, 'server.sock');
  const srv = net.createServer((s) => {
    s.once('readable', () => {
      const head = s.read(BULK_MAGIC.length) as Buffer;
      expect(head.equals(BULK_MAGIC)).toBe(true);
      bulk.raw.handle(s);
    });
  });
  await new Promise<void>((r) => srv.listen(sock, r));
  servers.push(p, srv);
  return { sock, podd };
}

/** present sends token on a new connection: the fd it got (read "hi" from it), or the error line. */
function present(sock: string, token: string): Promise<{ fd?: string; error?: { code: number; message: string } }> {
  return new Promise((resolve, reject) => {
    const u = new usocket.USocket();
    let text = '';
    u.on('error', reject);
    u.connect(sock, () => {
      u.on('readable', () => {
        const got = u.read(1, 1);
        if (got?.fds?.length) {
          u.removeAllListeners('readable');
          setImmediate(() => u.destroy());
          const s = new net.Socket({ fd: got.fds[0]!, readable: true, writable: true });
          let d = '';
          s.on('data', (b: Buffer) => (d += b.toString()));
          s.on('end', () => resolve({ fd: d }));
          return;
        }
        const b = u.read();
        if (b) text += b.toString();
      });
      u.on('end', () => resolve(JSON.parse(text) as { error: { code: number; message: string } }));
      u.write(Buffer.concat([BULK_MAGIC, Buffer.from(`${token}\n`)]));
    });
  });
}

test('a token passes the podd connection once; a second use is UNAUTHENTICATED', async () => {
  const bulk = new BulkChannel();
  const { sock, podd } = await node(bulk);
  const token = bulk.issue(me, 'sb-0123456789abcdef', REQ);
  await expect(present(sock, token)).resolves.toEqual({ fd: 'hi' });
  expect(podd.map((l) => JSON.parse(l))).toEqual([REQ]);
  const again = await present(sock, token);
  expect(again.error?.code).toBe(Status.UNAUTHENTICATED);
  expect(podd).toHaveLength(1);
});

test('a token of another uid or pid is PERMISSION_DENIED and used up', async () => {
  const bulk = new BulkChannel();
  const { sock } = await node(bulk);
  const other = bulk.issue({ uid: me.uid + 1, pid: me.pid }, 'sb-0123456789abcdef', REQ);
  expect((await present(sock, other)).error?.code).toBe(Status.PERMISSION_DENIED);
  // a process of the same uid that is not the caller (a child) presents the caller's token
  const mine = bulk.issue(me, 'sb-0123456789abcdef', REQ);
  const child = spawn(process.execPath, [
    '-e',
    `
    const net = require('node:net'); const s = net.connect(${JSON.stringify(sock)});
    s.on('connect', () => s.write(Buffer.concat([Buffer.from('SNBULK1\\n'), Buffer.from(${JSON.stringify(mine)} + '\\n')])));
    let d = ''; s.on('data', (b) => (d += b)); s.on('close', () => process.stdout.write(d));`,
  ]);
  let out = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  await new Promise((r) => child.on('close', r));
  expect((JSON.parse(out) as { error: { code: number } }).error.code).toBe(Status.PERMISSION_DENIED);
  expect((await present(sock, mine)).error?.code).toBe(Status.UNAUTHENTICATED);
});

test('an expired token is UNAUTHENTICATED; tokens per uid are bounded', async () => {
  let now = 1000;
  const bulk = new BulkChannel(undefined, 100, () => now);
  const { sock } = await node(bulk);
  const token = bulk.issue(me, 'sb-0123456789abcdef', REQ);
  now += 100;
  const r = await present(sock, token);
  expect(r.error?.code).toBe(Status.UNAUTHENTICATED);
  expect(r.error?.message).toMatch(/expired/);
  now += 1000;
  for (let i = 0; i < MAX_BULK_TOKENS_PER_UID; i++) bulk.issue(me, 'sb-0123456789abcdef', REQ);
  expect(() => bulk.issue(me, 'sb-0123456789abcdef', REQ)).toThrow(/unused bulk tokens/);
  expect(bulk.issue({ uid: me.uid + 1, pid: 1 }, 'sb-0123456789abcdef', REQ)).toMatch(/^[A-Za-z0-9_-]{43}$/);
});

test('a sandbox that is not RUNNING any more is FAILED_PRECONDITION and the podd is not called', async () => {
  const bulk = new BulkChannel();
  const { sock, podd } = await node(bulk);
  bulk.manager = { get: () => ({ state: 'PAUSED', poddAddress: 'unix:///nonexistent' }) } as unknown as SandboxManager;
  const r = await present(sock, bulk.issue(me, 'sb-0123456789abcdef', REQ));
  expect(r.error?.code).toBe(Status.FAILED_PRECONDITION);
  expect(podd).toHaveLength(0);
});

test('bulk connections that stall after the magic are bounded per uid: one more is RESOURCE_EXHAUSTED at once', async () => {
  const bulk = new BulkChannel();
  const { sock } = await node(bulk);
  // attack: MAX stallers (magic, then no token line) hold their slots; before, any number was held
  const stallers: net.Socket[] = [];
  for (let i = 0; i < MAX_BULK_CONNECTIONS_PER_UID; i++) {
    const s = net.connect({ path: sock });
    s.on('error', () => undefined);
    await new Promise((r) => s.once('connect', r));
    s.write(BULK_MAGIC);
    stallers.push(s);
  }
  // wait until the server holds them all (each is read by the test server and handed to serve)
  const token = bulk.issue(me, 'sb-0123456789abcdef', REQ);
  let r = await present(sock, token);
  for (let i = 0; i < 10 && r.error?.code !== Status.RESOURCE_EXHAUSTED; i++) r = await present(sock, bulk.issue(me, 'sb-0123456789abcdef', REQ));
  expect(r.error?.code).toBe(Status.RESOURCE_EXHAUSTED);
  for (const s of stallers) s.destroy();
  // once they are gone, a good token is served again (the server sees their ends soon after)
  let again = await present(sock, bulk.issue(me, 'sb-0123456789abcdef', REQ));
  for (let i = 0; i < 4 && !again.fd; i++) again = await present(sock, bulk.issue(me, 'sb-0123456789abcdef', REQ));
  expect(again).toEqual({ fd: 'hi' });
});

test('an oversize or garbage token line is INVALID_ARGUMENT (bad input), not INTERNAL', async () => {
  const bulk = new BulkChannel();
  const { sock, podd } = await node(bulk);
  expect((await present(sock, 'A'.repeat(200))).error?.code).toBe(Status.INVALID_ARGUMENT);
  expect((await present(sock, '\u0000\u00ff garbage')).error?.code).toBe(Status.UNAUTHENTICATED);
  expect(podd).toHaveLength(0);
});
