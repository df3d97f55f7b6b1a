/**
 * Attack: a hostile API caller on the server's unix socket against the first-bytes sniffing of
 * the bulk channel (bulk-channel.ts sniffRaw). Before the sniff, every connection went straight
 * to HTTP/2, where ServerGuards closes one that opened no stream within its handshake timeout
 * and counts it against maxConnectionsPerPeer. Found: a connection that sent nothing, or only a
 * prefix of BULK_MAGIC ("SNB"), never reached HTTP/2 nor the bulk handler, so it was held for
 * good, uncounted: one caller could hold server descriptors without bound (a slow-loris). Now
 * the sniff closes a connection that has not told its protocol within SNIFF_TIMEOUT_MS, and
 * holds at most SNIFF_MAX_PENDING_PER_UID undecided connections per uid (SO_PEERCRED) and
 * closes more at once. Honest calls are served meanwhile.
 */
import net from 'node:net';
import { readdirSync } from 'node:fs';
import { connectServerApi, SNIFF_MAX_PENDING_PER_UID, socketPath, unixAddress } from '@sandnode/shared';
import { describeNode, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

/** open connects to p and writes first (if any); resolves the connected socket. */
function open(p: string, first: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path: p });
    s.on('error', () => undefined);
    s.once('connect', () => {
      if (first) s.write(first);
      resolve(s);
    });
    s.once('error', reject);
  });
}

describeNode('attack: stalled connections against the sniffing unix listener', () => {
  let node: TestNode;
  const held: net.Socket[] = [];
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false });
  });
  afterAll(async () => {
    for (const s of held) s.destroy();
    await node?.stop();
  });

  test('connections that send nothing or "SNB" and stall are closed by the server; honest calls are served', async () => {
    const sock = socketPath(node.dirs.runDir, 'server');
    const [server] = serverProcesses(node.dirs.runDir);
    const before = readdirSync(`/proc/${server}/fd`).length;
    const closed = new Set<net.Socket>();
    for (let i = 0; i < 200; i++) {
      const s = await open(sock, i % 2 ? 'SNB' : '');
      s.on('close', () => closed.add(s));
      held.push(s);
    }
    // an honest client meanwhile, on its open connection and on a new connection per call: every call is served
    let failed = 0;
    for (let i = 0; i < 20; i++) await node.api.sandboxes.listSandboxes({ pageSize: 10 }).catch(() => failed++);
    for (let i = 0; i < 20; i++) {
      const api = connectServerApi(unixAddress(sock), 20_000);
      await api.sandboxes.listSandboxes({ pageSize: 10 }).catch(() => failed++);
      api.close();
    }
    expect(failed).toBe(0);
    expect(readdirSync(`/proc/${server}/fd`).length).toBeGreaterThanOrEqual(before + 150);
    // before: none of them was ever closed (held for good)
    await waitFor('the server closed every stalled connection', () => closed.size === 200, 60_000);
    await waitFor('the server let go of their descriptors', () => readdirSync(`/proc/${server}/fd`).length < before + 20, 30_000);
  });

  test('undecided connections beyond the per-uid limit are closed at once, not held', async () => {
    const sock = socketPath(node.dirs.runDir, 'server');
    const closed = new Set<net.Socket>();
    const extra = 20;
    for (let i = 0; i < SNIFF_MAX_PENDING_PER_UID + extra; i++) {
      const s = await open(sock, '');
      s.on('close', () => closed.add(s));
      held.push(s);
    }
    // well before the sniff timeout: the extra ones are gone, the others still open
    await waitFor('the connections above the limit were closed', () => closed.size >= extra, 5000);
    expect(closed.size).toBeLessThan(SNIFF_MAX_PENDING_PER_UID);
    let failed = 0;
    for (let i = 0; i < 10; i++) await node.api.sandboxes.listSandboxes({ pageSize: 10 }).catch(() => failed++);
    expect(failed).toBe(0);
    // a fresh CLI of the same uid is closed unserved: it says the node is up and why, not "is the node up? run: sandnode up"
    const cli = node.cli(['sandbox', 'list']);
    expect(cli.status).not.toBe(0);
    expect(cli.stderr).toContain('the node is up');
    expect(cli.stderr).not.toContain('is the node up');
  });
});
