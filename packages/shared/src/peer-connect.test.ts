/**
 * The connect wait of peer clients (peer-connect.ts) against a real gRPC server on a unix
 * socket that is stopped and started again, as a peer is by kill -9 and `sandnode up`:
 * - a call made while the channel is in its reconnect backoff (grpc-js would answer "No
 *   connection established" without sending it) is sent once the peer is back, also for
 *   PauseVm, which is not idempotent; the same call on a client without the wait fails;
 * - a call whose handler ran before the peer went away is not sent again (handler count);
 * - a peer that stays away: one UNAVAILABLE naming it, its socket and the connect error.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connectivityState } from '@grpc/grpc-js';
import { createServer, Status, type Server } from 'nice-grpc';
import { VmServiceDefinition, type VmServiceImplementation } from './gen/sandnode/vmm/v1/vmm';
import { createSandnodeChannel, createServiceClient } from './client';
import { DEFAULT_PEER_CONNECT_WAIT_MS, neverSent } from './peer-connect';
import { ClientError } from 'nice-grpc-common';

jest.setTimeout(30_000);

describe('neverSent', () => {
  it("is grpc-js's answer to a call that never left, and nothing else", () => {
    const e = (code: Status, details: string) => new ClientError('/p.S/M', code, details);
    expect(neverSent(e(Status.UNAVAILABLE, 'No connection established. Last error: Error: connect ENOENT /x.sock. Resolution note: '))).toBe(true);
    expect(neverSent(e(Status.INTERNAL, 'Failed to start HTTP/2 stream with error The session has been destroyed'))).toBe(true);
    expect(neverSent(e(Status.UNAVAILABLE, 'Connection dropped'))).toBe(false); // may have reached the peer
    expect(neverSent(e(Status.UNAVAILABLE, 'read ECONNRESET'))).toBe(false);
    expect(neverSent(e(Status.UNAVAILABLE, 'handed the node over: retry'))).toBe(false); // the peer answered it
    expect(neverSent(e(Status.INTERNAL, 'No connection established'))).toBe(false);
    expect(neverSent(new Error('No connection established'))).toBe(false);
  });
});

describe('peer clients wait for a restarting peer', () => {
  let dir: string;
  let sock: string;
  let server: Server | undefined;
  const calls = { pauseVm: 0, deleteVm: 0 };
  let hang: ((v: unknown) => void) | undefined;

  async function start(): Promise<void> {
    server = createServer();
    const impl: Record<string, unknown> = {};
    for (const name of Object.keys(VmServiceDefinition.methods)) impl[name] = async () => ({});
    impl.pauseVm = async (req: { vmId: string }) => {
      calls.pauseVm++;
      if (req.vmId === 'hang') await new Promise((r) => (hang = r)); // the handler runs; the peer dies under it
      return {};
    };
    impl.deleteVm = async () => (calls.deleteVm++, {});
    server.add(VmServiceDefinition, impl as unknown as VmServiceImplementation);
    await server.listen(`unix://${sock}`);
  }
  function stop(): void {
    server?.forceShutdown();
    server = undefined;
    rmSync(sock, { force: true });
  }

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'peer-connect-'));
    sock = path.join(dir, 'vmm-supervisor.sock');
    calls.pauseVm = calls.deleteVm = 0;
  });
  afterEach(() => {
    stop();
    hang?.(undefined);
    rmSync(dir, { recursive: true, force: true });
  });

  const peerOf = (waitMs = DEFAULT_PEER_CONNECT_WAIT_MS) => ({ name: 'vmm-supervisor', address: `unix://${sock}`, waitMs });

  /** inBackoff waits until channel has failed to connect (TRANSIENT_FAILURE: grpc-js's reconnect backoff). */
  async function inBackoff(channel: ReturnType<typeof createSandnodeChannel>): Promise<void> {
    while (channel.getConnectivityState(true) !== connectivityState.TRANSIENT_FAILURE) {
      await new Promise<void>((r) => channel.watchConnectivityState(channel.getConnectivityState(false), Date.now() + 1000, () => r()));
    }
  }

  it('a PauseVm made just after the restart, in the reconnect backoff, is sent once the peer is back; without the wait it fails unsent', async () => {
    await start();
    const channel = createSandnodeChannel(`unix://${sock}`);
    const client = createServiceClient(VmServiceDefinition, channel, { peer: peerOf(), timeoutMs: 20_000 });
    const plain = createServiceClient(VmServiceDefinition, channel, { timeoutMs: 20_000 });
    await client.pauseVm({ vmId: 'a' });
    stop();
    await inBackoff(channel);
    await start();
    // both in the same tick: the channel is still in its backoff
    const unsent = plain.pauseVm({ vmId: 'b' }).catch((e: unknown) => e);
    const sent = client.pauseVm({ vmId: 'c' });
    expect(await unsent).toMatchObject({ code: Status.UNAVAILABLE, details: expect.stringMatching(/^No connection established/) });
    await expect(sent).resolves.toBeDefined();
    expect(calls.pauseVm).toBe(2); // 'a' before the stop, 'c' after: 'b' never reached the peer
    channel.close();
  });

  it('a PauseVm whose handler ran when the peer went away is not sent again; an idempotent DeleteVm is, as before', async () => {
    await start();
    const channel = createSandnodeChannel(`unix://${sock}`);
    const client = createServiceClient(VmServiceDefinition, channel, { peer: peerOf(), timeoutMs: 20_000 });
    const p = client.pauseVm({ vmId: 'hang' }).catch((e: unknown) => e);
    while (calls.pauseVm === 0) await new Promise((r) => setTimeout(r, 5));
    stop();
    await start();
    const err = (await p) as { code: Status };
    expect([Status.UNAVAILABLE, Status.CANCELLED, Status.INTERNAL]).toContain(err.code);
    expect(calls.pauseVm).toBe(1);
    await client.deleteVm({ vmId: 'x' });
    expect(calls.deleteVm).toBe(1);
    channel.close();
  });

  it('a peer whose socket is missing: one UNAVAILABLE naming it, its socket and ENOENT, also for a retried idempotent call; sent once it is back', async () => {
    const channel = createSandnodeChannel(`unix://${sock}`);
    const client = createServiceClient(VmServiceDefinition, channel, { peer: peerOf(300), retryAttempts: 8, timeoutMs: 20_000 });
    for (const call of [() => client.pauseVm({ vmId: 'a' }), () => client.deleteVm({ vmId: 'a' })]) {
      const err = (await call().catch((e: unknown) => e)) as { code: Status; details: string };
      expect(err.code).toBe(Status.UNAVAILABLE);
      expect(err.details).toMatch(new RegExp(`^vmm-supervisor is not reachable \\(connect: ENOENT; for \\d+ ms\\); is it running\\? \`sandnode up\` starts it$`));
    }
    expect(calls).toEqual({ pauseVm: 0, deleteVm: 0 });
    // the outage is known (later calls fail at once while nothing listens), yet a peer that listens again is waited for
    // (a wait longer than the channel's reconnect backoff, as the default is: that is what lets a restarted peer in)
    await start();
    const after = createServiceClient(VmServiceDefinition, channel, { peer: peerOf(), timeoutMs: 20_000 });
    await expect(after.pauseVm({ vmId: 'b' })).resolves.toBeDefined();
    expect(calls.pauseVm).toBe(1);
    channel.close();
  });

  it('a socket left by a killed process: ECONNREFUSED', async () => {
    // a real listener killed with SIGKILL leaves its socket file behind
    const child = spawn(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(sock)}, () => console.log('up'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise((r) => child.stdout.once('data', r));
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    const channel = createSandnodeChannel(`unix://${sock}`);
    const client = createServiceClient(VmServiceDefinition, channel, { peer: peerOf(300), timeoutMs: 20_000 });
    await expect(client.resumeVm({ vmId: 'a' })).rejects.toMatchObject({ code: Status.UNAVAILABLE, details: expect.stringContaining(`not reachable (connect: ECONNREFUSED;`) });
    channel.close();
  });
});
