/**
 * The node's stable identity (issue 15 §3) on a whole node of real processes: every component
 * reports the same node_id in GetVersion, `status` and `version` show it, and it does not change
 * across `upgrade server`, a kill -9 and restart of vmm-supervisor and ublk-manager, or a
 * restart of the whole node on the same state dir.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { COMPONENTS, getVersion, killComponent, startComponent, upgradeServer } from '@sandnode/node-stack';
import { NODE_ID_FILE } from '@sandnode/shared';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

describeNode('node identity', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false });
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** ids is what each component's GetVersion says the node id is. */
  const ids = async () => Object.fromEntries(await Promise.all(COMPONENTS.map(async (c) => [c, (await getVersion(node.dirs, c))?.nodeId ?? '(down)'])));

  it('every component reports one id, the one kept in <stateDir>/node-id, and status/version show it', async () => {
    const kept = readFileSync(path.join(node.dirs.stateDir, NODE_ID_FILE), 'utf8').trim();
    expect(kept).toMatch(/^node-[0-9a-f]{16}$/);
    expect(await ids()).toEqual(Object.fromEntries(COMPONENTS.map((c) => [c, kept])));

    const status = node.cli(['status', '--json']);
    expect(status.status).toBe(0);
    const s = JSON.parse(status.stdout) as { nodeId: string; components: { name: string; nodeId: string }[] };
    expect(s.nodeId).toBe(kept);
    expect(s.components.map((c) => c.nodeId)).toEqual(COMPONENTS.map(() => kept));
    expect(node.cli(['status']).stdout).toContain(`node: ${kept}`);
    const v = JSON.parse(node.cli(['version', '--json']).stdout) as { components: { nodeId: string }[] };
    expect(v.components.map((c) => c.nodeId)).toEqual(COMPONENTS.map(() => kept));
    // and in each daemon's sandnode_build_info
    for (const c of COMPONENTS) {
      const body = await (await fetch(node.metricsUrl(c))).text();
      expect({ c, info: body.split('\n').find((l) => l.startsWith('sandnode_build_info{')) }).toEqual({ c, info: expect.stringContaining(`node_id="${kept}"`) });
    }
  });

  it('the id survives upgrade server and a kill -9 + restart of vmm-supervisor and ublk-manager', async () => {
    const before = await ids();
    // the upgrade reports its steps as the new server logs them (the CLI's progress lines), in order
    const steps: string[] = [];
    await upgradeServer(node.dirs, '.', undefined, (s) => steps.push(s));
    expect(steps).toEqual([
      expect.stringMatching(/^new server pid \d+ started in slot [ab] \(log .*server-[ab]\.log\)$/),
      expect.stringMatching(/^lease taken: epoch \d+, peers fenced$/),
      expect.stringMatching(/^serving: 0 sandboxes adopted in \d+ ms$/),
    ]);
    for (const c of ['vmm-supervisor', 'ublk-manager'] as const) {
      await killComponent(node.dirs, c);
      await startComponent(node.dirs, c);
    }
    expect(await ids()).toEqual(before);
  });
});
