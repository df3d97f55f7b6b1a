/**
 * Calls right after a peer restart (issue 11, chaos seed 3): kill -9 of the vmm-supervisor or
 * the ublk-manager on a whole node, a call while it is down (the server's channel fails to
 * connect and enters grpc-js's reconnect backoff), the peer started again, then at once the
 * calls a user makes: they all succeed. Before, PauseSandbox/ResumeSandbox (PauseVm/ResumeVm,
 * not idempotent, so not retried) failed UNAVAILABLE "No connection established" until the
 * backoff ended, although the peer was back. A create while the supervisor is down: UNAVAILABLE
 * naming it and its socket, within the peer wait (was: a raw grpc-js text after ~26 s), and
 * nothing is left of it.
 */
import { Status } from 'nice-grpc-common';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { killComponent, startComponent } from '@sandnode/node-stack';
import { describeNode, execCollect, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

/** Kill/restart rounds per peer: each round lands a call in the backoff (the backoff's phase differs per round). */
const ROUNDS = 3;

describeNode('calls right after a peer restart', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  test('vmm-supervisor killed -9 and started again: PauseSandbox, ResumeSandbox and Exec at once all succeed', async () => {
    const { api } = node;
    const sb = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    for (let round = 1; round <= ROUNDS; round++) {
      await killComponent(node.dirs, 'vmm-supervisor');
      // while it is down: the server's channel to it fails to connect (and backs off)
      await expect(api.sandboxes.pauseSandbox({ sandboxId: sb.sandboxId })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
      await startComponent(node.dirs, 'vmm-supervisor');
      const paused = (await api.sandboxes.pauseSandbox({ sandboxId: sb.sandboxId })).sandbox!;
      const resumed = (await api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId })).sandbox!;
      const out = await execCollect(api, sb.sandboxId, ['echo', `round ${round}`]);
      expect([paused.state, resumed.state, resumed.pid, out.stdout, out.exitCode]).toEqual([SandboxState.SANDBOX_STATE_PAUSED, SandboxState.SANDBOX_STATE_RUNNING, sb.pid, `round ${round}\n`, 0]);
    }
    await api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('ublk-manager killed -9 and started again: a create (GetVersion, CreateDevice) and a delete (DeleteDevice) at once succeed', async () => {
    const { api } = node;
    for (let round = 1; round <= ROUNDS; round++) {
      await killComponent(node.dirs, 'ublk-manager');
      // while it is down: a create is refused before it makes anything (a drain stops the manager)
      await expect(api.sandboxes.createSandbox({ template: 'base' })).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
      await startComponent(node.dirs, 'ublk-manager');
      const sb = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
      expect(sb.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
      await api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
    }
    expect((await api.sandboxes.listSandboxes({})).sandboxes).toEqual([]);
  });

  test('a create while the vmm-supervisor is down: UNAVAILABLE naming it and its socket, nothing left; creates again once it is back', async () => {
    const { api } = node;
    await killComponent(node.dirs, 'vmm-supervisor');
    try {
      const t0 = Date.now();
      const err = (await api.sandboxes.createSandbox({ template: 'base' }).catch((e: unknown) => e)) as { code: Status; details: string };
      console.log(`create with the vmm-supervisor down: ${Status[err.code]} after ${Date.now() - t0} ms: ${err.details}`);
      expect(err.code).toBe(Status.UNAVAILABLE);
      expect(err.details).toMatch(/^vmm-supervisor is not reachable \(connect: (ENOENT|ECONNREFUSED); for \d+ ms\); is it running\? `sandnode up` starts it$/);
      expect((await api.sandboxes.listSandboxes({})).sandboxes).toEqual([]);
    } finally {
      await startComponent(node.dirs, 'vmm-supervisor');
    }
    const sb = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    expect(sb.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
