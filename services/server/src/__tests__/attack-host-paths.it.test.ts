/**
 * Attack (issue 10 §1): a hostile sandbox plants symlinks where host root writes when one of
 * its copies boots (a fork child: the supervisor writes `/etc/machine-id` into the child's
 * upper dir on the host). Host files outside the sandbox's tree stay untouched.
 */
import { mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import type { ServerApi } from '@sandnode/shared';
import { describeNode, execCollect, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

async function sh(api: ServerApi, id: string, script: string): Promise<string> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  if (r.exitCode !== 0) throw new Error(`${script}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}

describeNode('a hostile sandbox cannot make host root write through its symlinks', () => {
  let node: TestNode;
  let victim: string;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });
  beforeEach(() => {
    victim = mkdtempSync(path.join(os.tmpdir(), 'sandnode-victim-'));
    writeFileSync(path.join(victim, 'machine-id'), 'host-owned\n');
  });
  afterEach(() => rmSync(victim, { recursive: true, force: true }));

  const untouched = () => {
    expect(readdirSync(victim)).toEqual(['machine-id']);
    expect(readFileSync(path.join(victim, 'machine-id'), 'utf8')).toBe('host-owned\n');
  };

  it('/etc replaced by a symlink to a host dir: the fork child boots, the host dir is untouched', async () => {
    const { api } = node;
    const parent = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await sh(api, parent.sandboxId, `cp -a /etc /etc.real && rm -rf /etc && ln -s ${victim} /etc`);
    const child = (await api.sandboxes.forkSandbox({ parentId: parent.sandboxId, maxFreezeMs: 1000 })).sandbox!;
    expect(child.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    untouched();
    // the child keeps the sandbox's own view: /etc is its symlink, resolved inside its rootfs
    expect((await sh(api, child.sandboxId, 'readlink /etc')).trim()).toBe(victim);
    for (const id of [child.sandboxId, parent.sandboxId]) await api.sandboxes.deleteSandbox({ sandboxId: id });
    untouched();
  });

  it('/etc/machine-id replaced by a symlink to a host file: the child gets its own file, the host file is untouched', async () => {
    const { api } = node;
    const parent = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await sh(api, parent.sandboxId, `rm -f /etc/machine-id && ln -s ${victim}/machine-id /etc/machine-id`);
    const child = (await api.sandboxes.forkSandbox({ parentId: parent.sandboxId, maxFreezeMs: 1000 })).sandbox!;
    untouched();
    expect((await sh(api, child.sandboxId, 'test -L /etc/machine-id && echo link || cat /etc/machine-id')).trim()).toMatch(/^[0-9a-f]{32}$/);
    for (const id of [child.sandboxId, parent.sandboxId]) await api.sandboxes.deleteSandbox({ sandboxId: id });
    untouched();
  });

  it("the host-side mounts of a sandbox's drives are nosuid,nodev: a device node it makes in /workspace opens nothing on the host", async () => {
    const { api } = node;
    const sb = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    // runc's default capabilities have no CAP_MKNOD here; if a runtime grants it, the host still opens nothing
    const made = (await sh(api, sb.sandboxId, 'mknod /workspace/null-dev c 1 3 2>/dev/null && echo made || echo refused')).trim();
    const mine = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' '))
      .filter((f) => f[4] && (f[4].startsWith(node.dirs.runDir) || f[4].startsWith(node.dirs.stateDir)) && f[4].includes(sb.sandboxId) && /\/(upper-dev|workspace)$/.test(f[4]));
    expect(mine.length).toBe(2);
    for (const f of mine) expect((f[5] ?? '').split(',')).toEqual(expect.arrayContaining(['nosuid', 'nodev']));
    const ws = mine.find((f) => f[4]!.endsWith('/workspace'))![4]!;
    if (made === 'made') expect(() => openSync(path.join(ws, 'null-dev'), 'r')).toThrow(/EACCES/);
    else expect(made).toBe('refused');
    await api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
