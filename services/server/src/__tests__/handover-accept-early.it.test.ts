/**
 * The new server accepts before it sends FinishHandover (issue 11 §4, handover gap): the
 * standby is held at `takeover.after-serve` (SANDNODE_SERVER_FAILPOINTS=...=pause: adopted,
 * handlers attached and warmed up, listening, FinishHandover not yet sent). Fresh connections
 * on the unix socket and on TCP made while it is held must all be answered, and some of them
 * by the new server: it already accepts beside the old one, so the clients the old server
 * sends GOAWAY reconnect into a process that serves at once. Before, the new server listened
 * only after FinishHandover, and none of these calls reached it. After SIGUSR2 the handover
 * completes and every fresh connection is the new server's.
 */
import { socketPath, unixAddress, type TakeoverResult } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { upgradeServer } from '@sandnode/node-stack';
import { createChannel, createClient, Metadata } from 'nice-grpc';
import { describeNode, serverProcesses, startNode, waitFor, withEnv, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

/** whoAnswers makes one call on a NEW connection (its own subchannel pool) and gives the answering server's pid. */
async function whoAnswers(address: string, token?: string): Promise<number> {
  const ch = createChannel(address, undefined, { 'grpc.use_local_subchannel_pool': 1 });
  try {
    const md = token ? Metadata({ authorization: `Bearer ${token}` }) : undefined;
    return (await createClient(VersionServiceDefinition, ch).getVersion({}, { signal: AbortSignal.timeout(8000), metadata: md })).pid;
  } finally {
    ch.close();
  }
}

describeNode('the new server accepts before FinishHandover', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ listen: '127.0.0.1:0', buildTemplate: false });
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('serves fresh connections beside the old server while held before FinishHandover, then alone', async () => {
    const unix = unixAddress(socketPath(node.dirs.runDir, 'server'));
    const tcp = node.tcpAddress();
    const token = node.tcpToken();
    const oldPid = serverProcesses(node.dirs.runDir)[0]!;
    expect(await whoAnswers(unix)).toBe(oldPid);

    let upgrade!: Promise<TakeoverResult>;
    await withEnv({ SANDNODE_SERVER_FAILPOINTS: 'takeover.after-serve=pause' }, async () => {
      upgrade = upgradeServer(node.dirs, '.', 60_000); // spawns before its first await
    });
    const newPid = await waitFor('the standby to start', async () => serverProcesses(node.dirs.runDir).find((p) => p !== oldPid), 30_000, 50);

    // held at the failpoint: it listens already; both servers answer fresh connections
    const seen = { unix: new Map<number, number>(), tcp: new Map<number, number>() };
    const count = (m: Map<number, number>, pid: number) => m.set(pid, (m.get(pid) ?? 0) + 1);
    await waitFor(
      'a fresh connection answered by the new server before FinishHandover',
      async () => {
        for (let i = 0; i < 10; i++) {
          count(seen.unix, await whoAnswers(unix));
          count(seen.tcp, await whoAnswers(tcp, token));
        }
        return (seen.unix.get(newPid) ?? 0) > 0 && (seen.tcp.get(newPid) ?? 0) > 0 ? true : undefined;
      },
      30_000,
      0,
    );
    // no third process answered, and the upgrade is still waiting for FinishHandover
    for (const m of [seen.unix, seen.tcp]) expect([...m.keys()].every((p) => p === oldPid || p === newPid)).toBe(true);
    let finished = false;
    void upgrade.then(() => (finished = true)).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 200));
    expect(finished).toBe(false);

    process.kill(newPid, 'SIGUSR2');
    const r = await upgrade;
    expect([r.oldPid, r.newPid]).toEqual([oldPid, newPid]);
    // from FinishHandover on, only the new server accepts
    for (let i = 0; i < 20; i++) {
      expect(await whoAnswers(unix)).toBe(newPid);
      expect(await whoAnswers(tcp, token)).toBe(newPid);
    }
    await waitFor('the old server to exit', async () => (serverProcesses(node.dirs.runDir).includes(oldPid) ? undefined : true), 30_000, 50);
  });
});
