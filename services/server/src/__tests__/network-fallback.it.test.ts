/**
 * Issue 12 §4 on a real node whose sandboxes get no network (startNode's default: the
 * supervisor's network off; on a branch without the supervisor's network, a supervisor that
 * lacks "vmm.network.v1"): a create that does not ask gets a sandbox without network and no
 * token; one that asks is FAILED_PRECONDITION naming the supervisor and why, and leaves nothing;
 * UpdateSandboxNetwork of a sandbox without network is FAILED_PRECONDITION; the CLI says the
 * same (exit codes and messages).
 */
import { Status } from '@sandnode/shared';
import { describeNode, expectCode, startNode, type TestNode } from '@sandnode/testkit';

describeNode('sandbox network fallback on a node without network', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  }, 180_000);
  afterAll(async () => {
    await node?.stop();
  }, 120_000);

  const base = { template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '' };

  it('unset: a sandbox without network and no token; set: FAILED_PRECONDITION naming the supervisor, nothing made', async () => {
    const r = await node.api.sandboxes.createSandbox(base);
    expect(r.sandbox?.network).toBeUndefined();
    expect(r.accessToken).toBe('');
    const before = (await node.api.sandboxes.listSandboxes({})).sandboxes.length;
    await expectCode(
      node.api.sandboxes.createSandbox({ ...base, network: { disabled: false, egress: { allowOut: ['example.com'], denyOut: [], blockAll: true }, public: false } }),
      Status.FAILED_PRECONDITION,
      /^CreateSandbox: the sandbox asks for a network, but (vmm-supervisor \S+ lacks feature "vmm\.network\.v1"|the vmm-supervisor \S+'s network is off: .+); .*nothing was created$/,
    );
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.length).toBe(before);
    await expectCode(node.api.sandboxes.updateSandboxNetwork({ sandboxId: r.sandbox!.sandboxId, egress: { allowOut: [], denyOut: [], blockAll: true } }), Status.FAILED_PRECONDITION, /has no network/);
    await expectCode(
      node.api.sandboxes.updateSandboxNetwork({ sandboxId: r.sandbox!.sandboxId, egress: { allowOut: ['10.1.2.3/8'], denyOut: [], blockAll: false } }),
      Status.INVALID_ARGUMENT,
      /^egress\.allow_out\[0\]/,
    );
    await node.api.sandboxes.deleteSandbox({ sandboxId: r.sandbox!.sandboxId });
  }, 120_000);

  it('the CLI: create --allow-out fails naming the supervisor; --no-network creates; network shows none; url is a usage error', async () => {
    const bad = node.cli(['sandbox', 'create', '--allow-out', 'example.com']);
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/vmm-supervisor/);
    const ok = node.cli(['sandbox', 'create', '--no-network', '--json']);
    expect(ok.status).toBe(0);
    const s = JSON.parse(ok.stdout) as { id: string; network: unknown; access_token: string };
    expect(s.network).toBeNull();
    expect(s.access_token).toBe('');
    expect(node.cli(['sandbox', 'network', s.id]).stdout.trim()).toBe('no network');
    const url = node.cli(['sandbox', 'url', s.id, '8080']);
    expect(url.status).toBe(1); // the command line is right; the sandbox has no ingress (2 is a wrong command line: newcomer)
    expect(url.stderr).toMatch(/has no ingress URL/);
    expect(node.cli(['sandbox', 'create', '--no-network', '--public']).status).toBe(2);
    expect(node.cli(['sandbox', 'delete', s.id]).status).toBe(0);
  }, 120_000);
});
