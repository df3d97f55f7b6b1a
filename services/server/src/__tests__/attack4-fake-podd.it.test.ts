/**
 * A sandbox that replaces its podd (attacker finding): the rootfs is the sandbox's, so its code
 * can rewrite /opt/sandnode/podd-boot.js and kill podd; sandnode-init starts the fake on the
 * inherited socket. The fake here floods every connection with junk. The node is up: the CLI must
 * say that the sandbox's podd did not answer and how to put it back, never "is the node up?".
 * Other sandboxes are served as before, and reset-rootfs gives the sandbox a working podd again.
 */
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { describeNode, execCollect, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

const FAKE = `
const net = require('node:net');
const junk = Buffer.alloc(1 << 16, 0x41);
net.createServer((c) => {
  c.on('error', () => {});
  const w = () => { while (c.write(junk)); c.once('drain', w); };
  w();
}).listen({ fd: 3 });
`;

describeNode('a sandbox that replaces its podd', () => {
  let node: TestNode;

  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  const cli = (...args: string[]) =>
    spawnSync(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', '', ...args], {
      encoding: 'utf8',
      timeout: 60_000,
    });

  test("the CLI says the sandbox's podd did not answer (the node is up), other sandboxes work, reset-rootfs restores podd", async () => {
    const bad = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const good = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    // the sandbox's own code replaces podd and kills it (sandnode-init starts podd-boot.js again)
    const script = `cat > /opt/sandnode/podd-boot.js <<'JS'\n${FAKE}\nJS\nkill $(pidof node) 2>/dev/null; true`;
    await execCollect(node.api, bad.sandboxId, ['sh', '-c', script]).catch(() => undefined); // the call may break as podd goes
    const r = await waitFor(
      'an exec through the fake podd to fail',
      () => {
        const x = cli('sandbox', 'exec', bad.sandboxId, '--', 'true');
        return x.status !== 0 ? x : undefined;
      },
      60_000,
      500,
    );
    expect(r.stderr).toMatch(/the sandbox's podd did not answer/);
    expect(r.stderr).toMatch(/sandnode: the node is up; the sandbox's agent \(podd\) did not answer/);
    expect(r.stderr).not.toMatch(/is the node up/);
    expect(r.stderr).not.toMatch(/too many connections/);
    // a copy through it says the same (its podd's features are asked on a channel of their own)
    const cp = cli('sandbox', 'cp', `${bad.sandboxId}:x.txt`, path.join(os.tmpdir(), `fake-podd-${bad.sandboxId}.txt`));
    expect(cp.status).toBe(1);
    expect(cp.stderr).toMatch(/the sandbox's podd did not answer/);
    expect(cp.stderr).not.toMatch(/is the node up/);
    // the node serves everyone else
    expect((await execCollect(node.api, good.sandboxId, ['echo', 'fine'])).stdout).toBe('fine\n');
    // as the hint says: reset-rootfs puts podd back (the rootfs anew, /workspace kept)
    const reset = cli('sandbox', 'reset-rootfs', bad.sandboxId);
    expect(reset.stderr).toBe('');
    expect(reset.status).toBe(0);
    expect((await execCollect(node.api, bad.sandboxId, ['echo', 'back'])).stdout).toBe('back\n');
  });
});
