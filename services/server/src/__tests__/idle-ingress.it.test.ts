/**
 * Idle actions and the ingress on a whole node with network (issue 14 §3): an ingress request to
 * a sandbox its pause_after_s paused resumes it (same pid) and is answered by the server in it; a
 * request without the token of a private sandbox is 401 and wakes nothing; with auto_resume off
 * the answer is 409 naming the state; a hibernated sandbox is woken by a request on the same
 * address (a cold start: its processes are new, so nothing listens until it is served again).
 */
import { SandboxState, type IdleSettings, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, startNode, waitFor, type TestNode } from '@sandnode/testkit';
import { ingressGet, serve } from './network-helpers';

jest.setTimeout(300_000);

describeNode('idle actions and the ingress (whole node, network)', () => {
  let node: TestNode;

  beforeAll(async () => {
    node = await startNode({ buildTemplate: true, network: true });
  });
  afterAll(async () => {
    await node?.stop();
  });

  const create = async (idle: Partial<IdleSettings>): Promise<{ sb: Sandbox; token: string }> => {
    const r = await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', idle: { pauseAfterS: 0, hibernateAfterS: 0, pausedTtlS: 0, ...idle } });
    return { sb: r.sandbox!, token: r.accessToken };
  };
  const get = async (id: string): Promise<Sandbox> => (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
  const waitState = (id: string, state: SandboxState, what: string) => waitFor(what, async () => ((await get(id)).state === state ? true : undefined), 60_000, 100);

  test('an ingress request resumes a paused sandbox (same pid) and is answered; without the token it is 401 and wakes nothing', async () => {
    const { sb, token } = await create({ pauseAfterS: 2 });
    await serve(node, sb.sandboxId);
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    expect((await ingressGet(node, sb.sandboxId)).status).toBe(401);
    expect((await get(sb.sandboxId)).state).toBe(SandboxState.SANDBOX_STATE_PAUSED);
    expect(await ingressGet(node, sb.sandboxId, token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    const back = await get(sb.sandboxId);
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(back.pid).toBe(sb.pid);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('auto_resume=false: 409 naming the state, and it stays PAUSED', async () => {
    const { sb, token } = await create({ pauseAfterS: 2, autoResume: false });
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    const r = await ingressGet(node, sb.sandboxId, token);
    expect(r.status).toBe(409);
    expect(r.body).toMatch(/is PAUSED and its idle.auto_resume is off/);
    expect((await get(sb.sandboxId)).state).toBe(SandboxState.SANDBOX_STATE_PAUSED);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('a request wakes a hibernated sandbox on the same address (cold start: new pid)', async () => {
    const { sb, token } = await create({ hibernateAfterS: 2 });
    await waitFor('the hibernation', async () => ((await get(sb.sandboxId)).idle?.hibernated ? true : undefined), 60_000, 100);
    // woken by the request; nothing listens on 8080 in the fresh boot
    expect((await ingressGet(node, sb.sandboxId, token)).status).toBe(502);
    const back = await get(sb.sandboxId);
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(back.pid).not.toBe(sb.pid);
    expect(back.network?.address).toBe(sb.network?.address);
    await serve(node, sb.sandboxId);
    expect(await ingressGet(node, sb.sandboxId, token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
